"""Chains in Redis with each host's mirror as witness (SPEC §16), through `HashChain` itself.

Hosts are `HashChain`s over a `MirroredChainStorage` each: one Redis namespace (the fleet), a
state directory per host (its mirror). What a host believes is `HashChain`'s verdict, so these
tests assert verdicts and revisions, as the admin and policy stores would see them.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import shared.fleet.chains as chains
from shared.chain import Fault, Verdict, encode_anchor
from shared.chainfile import ChainCorrupt, ChainUnwritable, HashChain
from shared.chainstorage import FileChainStorage, RevisionConflict
from shared.fleet.chains import RedisChainStorage
from shared.fleet.mirror import MirroredChainStorage
from tests.support.fleet import Fleet
from tests.support.harness import wait_until


def _host(fleet: Fleet, state_dir: Path) -> HashChain[list[dict[str, Any]]]:
    state_dir.mkdir(parents=True, exist_ok=True)
    path, anchor = str(state_dir / "account-admin.jsonl"), str(state_dir / "account-admin-head.json")
    storage = MirroredChainStorage(
        RedisChainStorage(fleet.sync, fleet.keys, "account-admin"), FileChainStorage(path, anchor)
    )
    return HashChain(path, anchor, list, storage=storage)


def _commit(chain: HashChain, n: int, expected: int | None = None) -> int:
    return chain.commit(lambda check: {"action": "set-state", "account_id": f"acct-{n}"}, expected).revision


def _redis(fleet: Fleet, part: str) -> bytes | None:
    return fleet.admin().get(fleet.keys.chain("account-admin", part))


def _lose_the_chain(fleet: Fleet) -> None:
    for part in ("records", "anchor", "rev", "seeded"):
        fleet.admin().delete(fleet.keys.chain("account-admin", part))


def test_a_write_on_one_host_is_read_and_mirrored_on_another(fleet: Fleet, tmp_path: Path) -> None:
    a, b = _host(fleet, tmp_path / "a"), _host(fleet, tmp_path / "b")
    assert b.read().check.verdict is Verdict.ABSENT
    assert _commit(a, 1, expected=0) == 1 and _commit(a, 2, expected=1) == 2
    view = b.read()
    assert view.check.verdict is Verdict.VERIFIED and [r["account_id"] for r in view.state] == ["acct-1", "acct-2"]
    assert (tmp_path / "b" / "account-admin.jsonl").read_bytes() == _redis(fleet, "records")
    assert (tmp_path / "b" / "account-admin-head.json").read_bytes() == _redis(fleet, "anchor")
    assert _commit(b, 3, expected=2) == 3 and a.read().check.revision == 3


def test_two_hosts_writing_at_one_revision_one_wins(fleet: Fleet, tmp_path: Path) -> None:
    hosts = [_host(fleet, tmp_path / f"h{i}") for i in range(4)]
    _commit(hosts[0], 0, expected=0)
    outcomes: list[str] = []
    start = threading.Barrier(len(hosts))

    def write(i: int) -> None:
        start.wait(10)
        try:
            _commit(hosts[i], i, expected=1)
            outcomes.append("committed")
        except RevisionConflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(hosts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(outcomes) == ["committed"] + ["conflict"] * 3
    assert all(h.read().check.revision == 2 for h in hosts)


def test_a_chain_redis_lost_is_reseeded_from_a_verified_mirror(fleet: Fleet, tmp_path: Path) -> None:
    a, fresh = _host(fleet, tmp_path / "a"), _host(fleet, tmp_path / "fresh")
    _commit(a, 1)
    _commit(a, 2)
    mirrored = (tmp_path / "a" / "account-admin.jsonl").read_bytes()
    _lose_the_chain(fleet)
    view = a.read()  # never read as an empty chain
    assert view.check.verdict is Verdict.VERIFIED and view.check.revision == 2
    assert _redis(fleet, "records") == mirrored
    assert fresh.read().check.revision == 2 and _commit(fresh, 3, expected=2) == 3


def test_the_longer_mirror_extends_a_seed_nobody_wrote_after(fleet: Fleet, tmp_path: Path) -> None:
    """Two hosts notice the loss; the one whose mirror is behind seeds first; the other's
    longer verified mirror then extends the seed instead of reading corrupt."""
    behind, ahead = _host(fleet, tmp_path / "behind"), _host(fleet, tmp_path / "ahead")
    _commit(ahead, 1)
    assert behind.read().check.revision == 1  # behind's mirror has record 1
    _commit(ahead, 2)  # ... but not record 2
    _lose_the_chain(fleet)
    assert behind.read().check.revision == 1  # seeds the one record it has
    assert ahead.read().check.revision == 2  # extends the seed with its second
    assert behind.read().check.revision == 2
    _commit(behind, 3)
    assert _redis(fleet, "seeded") is None  # a write closes the window


def test_a_redis_chain_shorter_than_the_mirror_is_corrupt_on_that_host(fleet: Fleet, tmp_path: Path) -> None:
    a, fresh = _host(fleet, tmp_path / "a"), _host(fleet, tmp_path / "fresh")
    _commit(a, 1)
    _commit(a, 2)
    first = _redis(fleet, "records").split(b"\n")[0] + b"\n"
    head = a.read().state[0]["hash"]
    admin = fleet.admin()  # a coherent rewrite in Redis: records and anchor agree with each other
    admin.set(fleet.keys.chain("account-admin", "records"), first)
    admin.set(fleet.keys.chain("account-admin", "anchor"), encode_anchor(1, head))
    admin.incr(fleet.keys.chain("account-admin", "rev"))
    check = a.read().check
    assert (check.verdict, check.fault) == (Verdict.CORRUPT, Fault.SHORTER_THAN_ANCHOR)
    with pytest.raises(ChainCorrupt):
        _commit(a, 3)  # a corrupt chain is never extended, by its reader's writer either
    assert _redis(fleet, "records") == first
    assert fresh.read().check.revision == 1  # a host with no witness cannot tell


def test_a_redis_chain_forked_from_the_mirror_is_corrupt_on_that_host(fleet: Fleet, tmp_path: Path) -> None:
    a, other_dir = _host(fleet, tmp_path / "a"), tmp_path / "forger"
    _commit(a, 1)
    forged = Fleet(fleet.server)  # another fleet's namespace writes a different, valid chain
    try:
        forger = _host(forged, other_dir)
        _commit(forger, 99)
        admin = fleet.admin()
        for part in ("records", "anchor"):
            admin.set(fleet.keys.chain("account-admin", part), _redis(forged, part))
        admin.incr(fleet.keys.chain("account-admin", "rev"))
    finally:
        forged.close_sync()
    check = a.read().check
    assert (check.verdict, check.fault) == (Verdict.CORRUPT, Fault.HEAD_MISMATCH)
    with pytest.raises(ChainCorrupt):
        _commit(a, 2)


def test_a_tampered_mirror_is_corrupt_on_its_host_only(fleet: Fleet, tmp_path: Path) -> None:
    a, b = _host(fleet, tmp_path / "a"), _host(fleet, tmp_path / "b")
    _commit(a, 1)
    assert b.read().check.revision == 1
    mirror = tmp_path / "b" / "account-admin.jsonl"
    mirror.write_bytes(mirror.read_bytes().replace(b"acct-1", b"acct-X"))
    assert b.read().check.verdict is Verdict.CORRUPT
    assert a.read().check.verdict is Verdict.VERIFIED


def test_a_writer_whose_lock_lapsed_writes_nothing(
    fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chains, "LOCK_LEASE_S", 0.2)
    a = _host(fleet, tmp_path / "a")
    lock = fleet.keys.chain("account-admin", "lock")

    def slow_build(check: Any) -> dict[str, Any]:
        wait_until(lambda: fleet.admin().get(lock) is None, 10, "the lock's lease to lapse")
        return {"action": "set-state", "account_id": "late"}

    with pytest.raises(ChainUnwritable):
        a.commit(slow_build, 0)
    assert _redis(fleet, "records") is None and a.read().check.revision == 0  # anchored empty, no record
    assert not (tmp_path / "a" / "account-admin.jsonl").exists()
