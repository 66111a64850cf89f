"""Rotating the fleet secret without stopping the fleet (README "Rotating the fleet secret"), on
a chain in a real Redis with each host's mirror: in step 1 hosts write with the old secret and
accept the new; in step 2 they write with the new and accept the old, so every host believes
every record throughout; in step 3, with the old secret gone, the first host to read the chain
re-seals it from its verified mirror and every host believes it again. A host that skipped step
1 (the old secret alone) reads a record of the new secret as forged: `corrupt`."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from shared.chain import SEAL_ACTION, ChainAuth, Fault, Verdict
from shared.chainfile import HashChain
from shared.chainstorage import FileChainStorage
from shared.fleet.chains import RedisChainStorage
from shared.fleet.entries import EntryKind, FleetEntries
from shared.fleet.mirror import MirroredChainStorage
from shared.fleet.secret import FleetSecret, Keyring
from tests.support.fleet import Fleet

OLD, NEW = FleetSecret(secrets.token_bytes(32)), FleetSecret(secrets.token_bytes(32))
NAME = "account-admin"


def host(
    fleet: Fleet, state_dir: Path, secret: FleetSecret, also: FleetSecret | None = None
) -> HashChain[list[dict[str, Any]]]:
    keyring = Keyring(secret, fleet.keys.fleet_id, also)
    auth = ChainAuth(
        keyring.key("chain/" + NAME),
        lambda: {"actor": "host:" + state_dir.name, "actor_authenticated_by": "fleet-secret"},
        verify_also=keyring.keys("chain/" + NAME)[1:],
    )
    state_dir.mkdir(parents=True, exist_ok=True)
    path, anchor = str(state_dir / "account-admin.jsonl"), str(state_dir / "account-admin-head.json")
    storage = MirroredChainStorage(
        RedisChainStorage(fleet.sync, fleet.keys, NAME), FileChainStorage(path, anchor), auth
    )
    return HashChain(path, anchor, list, storage=storage)


def commit(chain: HashChain, account: str, state: str) -> int:
    return chain.commit(lambda _c: {"action": "set-state", "account_id": account, "state": state}).revision


def verified(chain: HashChain) -> bool:
    return chain.read().check.verdict is Verdict.VERIFIED


def test_three_rolling_steps_keep_every_host_believing_the_chain(fleet: Fleet, tmp_path: Path) -> None:
    a, b = host(fleet, tmp_path / "a", OLD), host(fleet, tmp_path / "b", OLD)
    assert commit(a, "team-a", "disabled") == 1  # before: the old secret
    a, b = host(fleet, tmp_path / "a", OLD, NEW), host(fleet, tmp_path / "b", OLD, NEW)  # step 1
    assert commit(b, "team-b", "disabled") == 2 and verified(a)
    lagging = host(fleet, tmp_path / "lagging", OLD)  # a host that skipped step 1
    assert verified(lagging)
    a = host(fleet, tmp_path / "a", NEW, OLD)  # step 2, one pair at a time
    assert commit(a, "team-a", "enabled") == 3
    assert verified(a) and verified(b)  # b (step 1) accepts the new MAC
    view = lagging.read()
    assert (view.check.verdict, view.check.fault) == (Verdict.CORRUPT, Fault.MAC_MISMATCH)
    b = host(fleet, tmp_path / "b", NEW, OLD)
    assert verified(b)
    a = host(fleet, tmp_path / "a", NEW)  # step 3: the old secret gone
    view = a.read()  # re-sealed from a's mirror
    assert view.check.verdict is Verdict.VERIFIED and view.state is not None
    assert view.state[-1]["action"] == SEAL_ACTION and view.check.revision == 4
    assert [r["state"] for r in view.state if r["action"] == "set-state"] == ["disabled", "disabled", "enabled"]
    assert verified(b)  # the seal is the new secret's
    b = host(fleet, tmp_path / "b", NEW)
    assert verified(b) and commit(b, "team-b", "enabled") == 5


def test_entries_verify_under_either_secret_only_while_both_are_given() -> None:
    old_writer = FleetEntries(Keyring(OLD, "f"))
    new_writer = FleetEntries(Keyring(NEW, "f", OLD))
    tags = {
        "old": old_writer.mac(EntryKind.SPEND, ["gw-a", "2026-12"]),
        "new": new_writer.mac(EntryKind.SPEND, ["gw-a", "2026-12"]),
    }
    assert tags["new"] == FleetEntries(Keyring(NEW, "f")).mac(EntryKind.SPEND, ["gw-a", "2026-12"])  # never OLD's
    rotating = [FleetEntries(Keyring(OLD, "f", NEW)), FleetEntries(Keyring(NEW, "f", OLD))]
    for reader in rotating:
        assert all(reader.valid(EntryKind.SPEND, ["gw-a", "2026-12"], tag) for tag in tags.values())
        assert not reader.valid(EntryKind.SPEND, ["gw-b", "2026-12"], tags["old"])
    assert not FleetEntries(Keyring(NEW, "f")).valid(EntryKind.SPEND, ["gw-a", "2026-12"], tags["old"])
    assert not FleetEntries(Keyring(OLD, "f")).valid(EntryKind.SPEND, ["gw-a", "2026-12"], tags["new"])
    assert Keyring(NEW, "f", NEW).keys("entry/spend") == Keyring(NEW, "f").keys("entry/spend")  # one key
