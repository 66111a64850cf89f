"""Chains in Redis authenticate their records (SPEC §19), with a real Redis and each host's mirror.

A Redis writer without the fleet secret appends a well-formed record with a recomputed hash and
anchor: every host reads the chain `corrupt` (mints held, writes refused) and none mirrors it. An
embedded chain entering fleet mode is re-seeded from its mirror and adopted once by a `seal`
record whose MAC covers the head it adopts; a chain extended by a forger beyond any mirror is
not adopted. After a rotation of the secret, a host whose mirror holds the whole chain re-seals it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shared.chain import SEAL_ACTION, ChainAuth, Fault, Verdict, encode_anchor, encode_record, seal
from shared.chainfile import ChainCorrupt, HashChain
from shared.chainstorage import FileChainStorage
from shared.fleet.chains import RedisChainStorage
from shared.fleet.mirror import MirroredChainStorage
from shared.fleet.secret import FleetSecret
from tests.support.fleet import Fleet

SECRET = FleetSecret(b"fleet-secret-for-these-tests-32b!")
NAME = "account-admin"


def auth_of(secret: FleetSecret, fleet: Fleet, host: str) -> ChainAuth:
    return ChainAuth(
        secret.key(fleet.keys.fleet_id, "chain/" + NAME),
        lambda: {"actor": "host:" + host, "actor_authenticated_by": "fleet-secret"},
    )


def host(fleet: Fleet, state_dir: Path, secret: FleetSecret = SECRET) -> HashChain[list[dict[str, Any]]]:
    state_dir.mkdir(parents=True, exist_ok=True)
    path, anchor = str(state_dir / "account-admin.jsonl"), str(state_dir / "account-admin-head.json")
    storage = MirroredChainStorage(
        RedisChainStorage(fleet.sync, fleet.keys, NAME),
        FileChainStorage(path, anchor),
        auth_of(secret, fleet, state_dir.name),
    )
    return HashChain(path, anchor, list, storage=storage)


def commit(chain: HashChain, account: str, state: str) -> int:
    return chain.commit(lambda _c: {"action": "set-state", "account_id": account, "state": state}).revision


def forge(fleet: Fleet, fields: dict[str, Any], mac: str | None = None) -> None:
    """What a Redis writer can do: read the chain, append a record with a correct hash, re-anchor."""
    import json

    admin = fleet.admin()
    data = admin.get(fleet.keys.chain(NAME, "records")) or b""
    lines = data.splitlines()
    prev = json.loads(lines[-1])["hash"] if lines else "0" * 64
    record = seal(fields, len(lines) + 1, prev)
    if mac is not None:
        record["mac"] = mac
    admin.append(fleet.keys.chain(NAME, "records"), encode_record(record))
    admin.set(fleet.keys.chain(NAME, "anchor"), encode_anchor(len(lines) + 1, record["hash"]))
    admin.incr(fleet.keys.chain(NAME, "rev"))


ENABLE = {
    "at": "2026-12-01T00:00:00.000Z",
    "actor": "alice",
    "actor_authenticated_by": "control-token",
    "account_id": "team-a",
    "action": "set-state",
    "state": "enabled",
    "reason": "forged",
}


@pytest.mark.parametrize("mac", [None, "A" * 43], ids=["no-mac", "wrong-mac"])
def test_a_forged_record_is_corrupt_on_every_host_and_never_mirrored(
    fleet: Fleet, tmp_path: Path, mac: str | None
) -> None:
    a, b = host(fleet, tmp_path / "a"), host(fleet, tmp_path / "b")
    assert commit(a, "team-a", "disabled") == 1
    assert b.read().state[-1]["state"] == "disabled" and "mac" in b.read().state[-1]
    mirror_before = (tmp_path / "b" / "account-admin.jsonl").read_bytes()
    forge(fleet, ENABLE, mac)
    for chain in (a, b):
        view = chain.read()
        assert (view.check.verdict, view.check.fault, view.state) == (Verdict.CORRUPT, Fault.MAC_MISMATCH, None)
        with pytest.raises(ChainCorrupt):
            commit(chain, "team-b", "disabled")
    assert (tmp_path / "b" / "account-admin.jsonl").read_bytes() == mirror_before
    assert b"forged" not in (tmp_path / "a" / "account-admin.jsonl").read_bytes()
    c = host(fleet, tmp_path / "c")  # a new host (an empty mirror) does not adopt a forgery either
    assert c.read().check.verdict is Verdict.CORRUPT
    assert (
        not (tmp_path / "c" / "account-admin.jsonl").exists()
        or b"forged" not in (tmp_path / "c" / "account-admin.jsonl").read_bytes()
    )


def test_an_embedded_chain_is_adopted_once_by_an_audited_seal(fleet: Fleet, tmp_path: Path) -> None:
    state = tmp_path / "a"
    state.mkdir()
    embedded = HashChain(str(state / "account-admin.jsonl"), str(state / "account-admin-head.json"), list)
    commit(embedded, "team-a", "disabled")
    commit(embedded, "team-b", "draining")
    head = embedded.read().check.head_hash
    a = host(fleet, state)
    view = a.read()
    assert view.check.verdict is Verdict.VERIFIED and view.check.revision == 3
    sealed = view.state[-1]
    assert (sealed["action"], sealed["adopts_hash"], sealed["prev_hash"], sealed["adopts_count"]) == (
        SEAL_ACTION,
        head,
        head,
        2,
    )
    assert sealed["actor"] == "host:a" and a.auth is not None and a.auth.valid(sealed)
    b = host(fleet, tmp_path / "b")
    assert b.read().check.revision == 3 and commit(b, "team-a", "enabled") == 4
    assert a.read().check.revision == 4 and [r["action"] for r in a.read().state].count(SEAL_ACTION) == 1


def test_a_forged_chain_beyond_every_mirror_is_not_adopted(fleet: Fleet, tmp_path: Path) -> None:
    forge(fleet, ENABLE)
    a = host(fleet, tmp_path / "a")
    assert a.read().check.verdict is Verdict.CORRUPT
    assert SEAL_ACTION.encode() not in (fleet.admin().get(fleet.keys.chain(NAME, "records")) or b"")


def test_after_a_rotation_a_host_with_the_whole_chain_reseals_it(fleet: Fleet, tmp_path: Path) -> None:
    a, b = host(fleet, tmp_path / "a"), host(fleet, tmp_path / "b")
    commit(a, "team-a", "disabled")
    assert b.read().check.revision == 1
    rotated = FleetSecret(b"the-new-fleet-secret-of-32-bytes!!")
    a2 = host(fleet, tmp_path / "a", rotated)
    view = a2.read()
    assert view.check.verdict is Verdict.VERIFIED and view.state[-1]["action"] == SEAL_ACTION
    b2 = host(fleet, tmp_path / "b", rotated)
    assert b2.read().check.revision == 2 and commit(b2, "team-a", "enabled") == 3
    assert a2.read().check.revision == 3


def test_a_forged_chain_reads_corrupt_at_once_while_another_writer_holds_the_lock(fleet: Fleet, tmp_path: Path) -> None:
    """The fleet soak once saw mints held `fleet-state-unavailable` while a forged record sat in
    Redis: every corrupt read tried to seal under the fleet's writer lock, a `revoke-leases`
    held that lock for seconds, and the host had no recently validated view of its chain. A
    forgery is never sealable, so its read must not ask for the lock at all."""
    a, b = host(fleet, tmp_path / "a"), host(fleet, tmp_path / "b")
    commit(a, "team-a", "disabled")
    assert b.read().check.revision == 1
    forge(fleet, ENABLE)
    holder = b.storage
    assert isinstance(holder, MirroredChainStorage)
    with holder.writer():  # another writer (say a revoke-leases waiting for the fleet) holds the lock
        lock_waits = a.storage.remote.writer  # type: ignore[attr-defined]
        asked: list[bool] = []

        def noted() -> Any:
            asked.append(True)
            return lock_waits()

        a.storage.remote.writer = noted  # type: ignore[attr-defined]
        view = a.read()
    assert (view.check.verdict, view.check.fault) == (Verdict.CORRUPT, Fault.MAC_MISMATCH)
    assert asked == [], "a forged chain's read asked for the writer's lock"
