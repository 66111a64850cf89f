"""`AccountAdminStore` and `HashChain` on real files: D5's bullets, one test each."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import filelock
import pytest
from structlog.testing import capture_logs

from controlplane.stores.admin import ANCHOR_FILE, CHAIN_FILE, AccountAdminStore
from shared.chain import ChainCheck, Fault, Verdict, encode_anchor, record_hash
from shared.chainfile import HashChain
from shared.codes import AdminState
from shared.errors import GatewayError

ACCOUNTS = ("legacy-anthropic", "legacy-zai-harness", "legacy-openai", "team-b")
RECORD_FIELDS = {
    "seq",
    "prev_hash",
    "hash",
    "at",
    "actor",
    "actor_authenticated_by",
    "account_id",
    "action",
    "state",
    "reason",
}


def make_store(tmp_path: Path, **kw: Any) -> AccountAdminStore:
    return AccountAdminStore(str(tmp_path), ACCOUNTS, **kw)


async def disable(
    store: AccountAdminStore, account_id: str = "team-b", state: str = "disabled", expected_revision: int | None = None
) -> Any:
    return await store.set_state(
        account_id,
        AdminState(state),
        reason="incident 42",
        actor="alice",
        authenticated_by="control-token",
        expected_revision=expected_revision,
    )


def chain_lines(tmp_path: Path) -> list[bytes]:
    return (tmp_path / CHAIN_FILE).read_bytes().splitlines(keepends=True)


def anchor(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / ANCHOR_FILE).read_bytes())


async def three_records(tmp_path: Path) -> AccountAdminStore:
    store = make_store(tmp_path)
    await disable(store, "team-b")
    await disable(store, "legacy-openai", "draining")
    await disable(store, "team-b", "enabled")
    return store


# ---- reads ------------------------------------------------------------------------------------


def test_no_chain_reads_absent_and_everything_enabled(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    view = store.read()
    assert view.check.verdict is Verdict.ABSENT and view.check.revision == 0
    assert store.verdict() is Verdict.ABSENT and not store.is_unavailable()
    assert all(store.state_of(a) is AdminState.ENABLED for a in ACCOUNTS)


async def test_a_commit_appends_one_spec_shaped_record_and_anchors_it(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    done = await disable(store)
    assert done.revision == 1 and done.based_on_revision == 0
    (line,) = chain_lines(tmp_path)
    record = json.loads(line)
    assert set(record) == RECORD_FIELDS
    assert record == done.record
    assert record["seq"] == 1 and record["prev_hash"] == "0" * 64 and record_hash(record) == record["hash"]
    assert (record["account_id"], record["action"], record["state"], record["reason"]) == (
        "team-b",
        "set-state",
        "disabled",
        "incident 42",
    )
    assert (record["actor"], record["actor_authenticated_by"]) == ("alice", "control-token")
    assert anchor(tmp_path) == {"count": 1, "head_hash": record["hash"]}
    assert store.verdict() is Verdict.VERIFIED and store.state_of("team-b") is AdminState.DISABLED
    assert oct((tmp_path / CHAIN_FILE).stat().st_mode & 0o777) == "0o600"


def test_the_empty_anchor_is_seeded_before_the_first_append(tmp_path: Path) -> None:
    chain = HashChain(str(tmp_path / "c.jsonl"), str(tmp_path / "c-head.json"), len)
    seen: dict[str, Any] = {}

    def build(check: ChainCheck) -> dict[str, Any]:
        seen["anchor"] = json.loads((tmp_path / "c-head.json").read_bytes())
        seen["chain_exists"] = (tmp_path / "c.jsonl").exists()
        return {"x": 1}

    chain.commit(build)
    assert seen == {"anchor": {"count": 0, "head_hash": None}, "chain_exists": False}


async def test_revision_and_overlay_come_from_one_read(tmp_path: Path) -> None:
    store = await three_records(tmp_path)
    view = store.read()
    assert view.check.revision == view.state.revision == 3
    assert view.state.states == {"team-b": AdminState.ENABLED, "legacy-openai": AdminState.DRAINING}
    assert store.chain.head().seq == 3


async def test_an_unchanged_chain_is_served_from_cache(tmp_path: Path) -> None:
    store = await three_records(tmp_path)
    first = store.read()
    reads = store.chain.full_reads
    assert store.read() is first and store.overlay() is first.state
    assert store.chain.full_reads == reads
    await disable(store, "legacy-anthropic")
    assert store.read().check.revision == 4 and store.chain.full_reads == reads + 1


# ---- tamper cases: corrupt, the overlay withheld (mint held), every mutation refused ---------


def _edit_earlier(tmp_path: Path) -> None:
    lines = chain_lines(tmp_path)
    record = json.loads(lines[0])
    record["state"] = "enabled"  # the operator's disable, quietly undone
    lines[0] = json.dumps(record).encode() + b"\n"
    (tmp_path / CHAIN_FILE).write_bytes(b"".join(lines))


def _drop_last(tmp_path: Path) -> None:
    (tmp_path / CHAIN_FILE).write_bytes(b"".join(chain_lines(tmp_path)[:-1]))


def _truncate_to_empty(tmp_path: Path) -> None:
    (tmp_path / CHAIN_FILE).write_bytes(b"")


def _delete_anchor(tmp_path: Path) -> None:
    (tmp_path / ANCHOR_FILE).unlink()


def _torn_final_line(tmp_path: Path) -> None:
    lines = chain_lines(tmp_path)
    (tmp_path / CHAIN_FILE).write_bytes(b"".join(lines[:-1]) + lines[-1][:30])


TAMPER = [
    (_edit_earlier, Fault.HASH_MISMATCH),
    (_drop_last, Fault.SHORTER_THAN_ANCHOR),
    (_truncate_to_empty, Fault.EMPTY_WITH_ANCHOR),
    (_delete_anchor, Fault.ANCHOR_MISSING),
    (_torn_final_line, Fault.TORN_LINE),
]


@pytest.mark.parametrize(("tamper", "fault"), TAMPER, ids=[f.value for _, f in TAMPER])
async def test_tampering_reads_corrupt_and_refuses_every_mutation(tmp_path: Path, tamper: Any, fault: Fault) -> None:
    store = await three_records(tmp_path)
    assert store.read().check.verdict is Verdict.VERIFIED  # warm the cache first
    tamper(tmp_path)
    before = ((tmp_path / CHAIN_FILE).read_bytes(), (tmp_path / ANCHOR_FILE).exists())

    view = make_store(tmp_path).read()  # a cold reader
    assert (view.check.verdict, view.check.fault) == (Verdict.CORRUPT, fault)
    assert store.read().check.fault is fault  # the warm one notices too
    assert store.is_unavailable() and store.overlay() is None  # → every v2 mint held
    assert store.state_of("team-b") is AdminState.DISABLED  # and nothing reads as enabled
    for attempt in (
        disable(store),
        store.revoke_leases("team-b", _never, reason="r", actor=None, authenticated_by="control-token"),
    ):
        with pytest.raises(GatewayError) as refused:
            await attempt
        assert (refused.value.status, refused.value.code) == (503, "account-state-unavailable")
        assert refused.value.extra == {"chain_verdict": "corrupt", "chain_reason": str(fault)}
    assert ((tmp_path / CHAIN_FILE).read_bytes(), (tmp_path / ANCHOR_FILE).exists()) == before


async def test_a_mutation_decides_from_the_file_not_the_cache(tmp_path: Path) -> None:
    store = await three_records(tmp_path)
    trusted = store.read()
    _edit_earlier(tmp_path)
    # An edit the cache key cannot see (the key names the head, not every record): pin the
    # pre-edit view under the post-edit key, as such an edit would leave it.
    store.chain._cache = (store.chain._key(), trusted)
    assert store.read() is trusted  # tolerated for a read: a cold reader catches it
    with pytest.raises(GatewayError) as refused:
        await disable(store, "legacy-anthropic", expected_revision=3)
    assert refused.value.extra["chain_reason"] == "hash-mismatch"
    assert len(chain_lines(tmp_path)) == 3


async def _never(account_id: str) -> int:
    raise AssertionError("a refused mutation must not revoke")


# ---- the crash window and the anchor write --------------------------------------------------


async def test_crash_window_reads_verified_and_the_next_commit_re_anchors(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    await disable(store, "team-b")
    stale_anchor = (tmp_path / ANCHOR_FILE).read_bytes()
    await disable(store, "legacy-openai")
    (tmp_path / ANCHOR_FILE).write_bytes(stale_anchor)  # crashed after the append, before the anchor

    view = make_store(tmp_path).read()
    assert view.check.verdict is Verdict.VERIFIED and view.check.revision == 2
    assert view.state.state_of("legacy-openai") is AdminState.DISABLED
    done = await disable(store, "team-b", "enabled", expected_revision=2)
    assert anchor(tmp_path) == {"count": 3, "head_hash": done.record["hash"]}
    assert make_store(tmp_path).read().check.revision == 3


async def test_a_failed_anchor_write_after_the_append_does_not_fail_the_mutation(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    await disable(store, "team-b")
    blocker = tmp_path / (ANCHOR_FILE + ".tmp")
    blocker.mkdir()  # the anchor's temp file cannot be created: the anchor write fails
    with capture_logs() as logs:
        done = await disable(store, "legacy-openai", expected_revision=1)
    assert done.revision == 2 and len(chain_lines(tmp_path)) == 2
    assert anchor(tmp_path)["count"] == 1
    assert [e["revision"] for e in logs if e["event"] == "chain_anchor_write_failed"] == [2]
    assert store.read().check.verdict is Verdict.VERIFIED  # the accepted crash window
    assert store.state_of("legacy-openai") is AdminState.DISABLED

    blocker.rmdir()
    done = await disable(store, "legacy-openai", "enabled", expected_revision=2)
    assert anchor(tmp_path) == {"count": 3, "head_hash": done.record["hash"]}


async def test_a_re_anchor_that_fails_before_the_append_refuses_without_appending(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    await disable(store, "team-b")
    (tmp_path / ANCHOR_FILE).write_bytes(encode_anchor(0, None))  # crash window of the first append
    (tmp_path / (ANCHOR_FILE + ".tmp")).mkdir()
    with pytest.raises(GatewayError) as refused:
        await disable(store, "legacy-openai")
    assert (refused.value.status, refused.value.code) == (503, "account-state-unavailable")
    assert len(chain_lines(tmp_path)) == 1  # never two records past the anchor


# ---- revisions and concurrency -------------------------------------------------------------


async def test_a_stale_expected_revision_is_409_naming_the_current_one(tmp_path: Path) -> None:
    store = await three_records(tmp_path)
    with pytest.raises(GatewayError) as conflict:
        await disable(store, expected_revision=2)
    assert (conflict.value.status, conflict.value.code) == (409, "revision-conflict")
    assert conflict.value.extra == {"current_revision": 3, "expected_revision": 2}
    assert len(chain_lines(tmp_path)) == 3


async def test_two_mutations_at_one_expected_revision_exactly_one_commits(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    other = make_store(tmp_path)  # a second writer instance: only the file lock orders them
    await disable(store, "legacy-anthropic")
    outcomes = await asyncio.gather(
        disable(store, "team-b", expected_revision=1),
        disable(other, "legacy-openai", expected_revision=1),
        return_exceptions=True,
    )
    committed = [o for o in outcomes if not isinstance(o, BaseException)]
    refused = [o for o in outcomes if isinstance(o, GatewayError)]
    assert len(committed) == 1 and len(refused) == 1
    assert refused[0].status == 409 and refused[0].extra["current_revision"] == 2
    assert committed[0].revision == 2 and len(chain_lines(tmp_path)) == 2


async def test_unknown_account_is_refused_without_a_record(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    with pytest.raises(GatewayError) as refused:
        await disable(store, "nobody")
    assert (refused.value.status, refused.value.code) == (404, "not-found")
    assert not (tmp_path / CHAIN_FILE).exists()


# ---- revoke-leases: after the revision check, before the append, under the lock ------------


async def test_revoke_leases_runs_between_the_revision_check_and_the_append(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    seen: list[tuple[str, int]] = []

    async def revoke(account_id: str) -> int:
        lines = chain_lines(tmp_path) if (tmp_path / CHAIN_FILE).exists() else []
        seen.append((account_id, len(lines)))
        return 2

    done = await store.revoke_leases(
        "team-b", revoke, reason="leak", actor="bob", authenticated_by="control-token", expected_revision=0
    )
    assert seen == [("team-b", 0)]  # ran before its record existed
    assert done.revoked == 2 and done.revision == 1
    record = json.loads(chain_lines(tmp_path)[0])
    assert (record["action"], record["state"], record["account_id"]) == ("revoke-leases", None, "team-b")
    assert store.state_of("team-b") is AdminState.ENABLED  # revoking leases sets no state

    with pytest.raises(GatewayError) as conflict:  # a stale request never destroys leases
        await store.revoke_leases(
            "team-b", revoke, reason="leak", actor="bob", authenticated_by="control-token", expected_revision=0
        )
    assert conflict.value.status == 409 and len(seen) == 1


async def test_the_lock_is_held_while_the_revocation_runs(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    started, release = asyncio.Event(), asyncio.Event()

    async def slow_revoke(account_id: str) -> int:
        started.set()
        await release.wait()
        return 1

    revoking = asyncio.ensure_future(
        store.revoke_leases(
            "team-b", slow_revoke, reason="leak", actor=None, authenticated_by="control-token", expected_revision=0
        )
    )
    await asyncio.wait_for(started.wait(), 5)
    probe = filelock.FileLock(store.chain.lock_path, timeout=0)
    with pytest.raises(filelock.Timeout):  # the writer's lock is held while the revocation runs
        probe.acquire()
    racing = asyncio.ensure_future(disable(store, "legacy-openai", expected_revision=0))
    release.set()
    done = await revoking
    with pytest.raises(GatewayError) as conflict:
        await racing
    assert done.revision == 1 and conflict.value.status == 409
    assert [json.loads(line)["action"] for line in chain_lines(tmp_path)] == ["revoke-leases"]


async def test_a_failed_revocation_records_nothing(tmp_path: Path) -> None:
    store = make_store(tmp_path)

    async def broken(account_id: str) -> int:
        raise RuntimeError("data plane gone")

    with pytest.raises(GatewayError) as failed:
        await store.revoke_leases("team-b", broken, reason="r", actor=None, authenticated_by="control-token")
    assert failed.value.status == 500
    assert not (tmp_path / CHAIN_FILE).exists()
    await disable(store, expected_revision=0)  # and the lock was released


async def test_on_commit_sees_every_committed_record(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    store = make_store(tmp_path, on_commit=seen.append)
    done = await disable(store)
    assert seen == [done.record]


# ---- readers against a writer ----------------------------------------------------------------


def test_four_readers_never_see_a_false_corrupt_while_a_writer_appends(tmp_path: Path) -> None:
    path, head_path = str(tmp_path / "c.jsonl"), str(tmp_path / "c-head.json")
    writer = HashChain(path, head_path, len)
    appends = 200
    done = threading.Event()
    seen: list[list[tuple[Verdict, int | None, int | None]]] = [[] for _ in range(4)]

    shared = HashChain(path, head_path, len)  # one cache read from two threads at once

    def read(out: list[tuple[Verdict, int | None, int | None]], reader: HashChain) -> None:
        while not done.is_set():
            view = reader.read()
            out.append((view.check.verdict, view.check.revision, view.state))
            time.sleep(0)  # a yield, not a wait: hand the GIL to the writer between reads

    readers = [shared, shared, HashChain(path, head_path, len), HashChain(path, head_path, len)]
    threads = [threading.Thread(target=read, args=(out, r)) for out, r in zip(seen, readers)]
    for thread in threads:
        thread.start()
    try:
        for n in range(appends):
            writer.commit(lambda check: {"n": n, "pad": "x" * 200})
    finally:
        done.set()
        for thread in threads:
            thread.join(10)
    for out in seen:
        false_corrupt = [c for c in out if c[0] is Verdict.CORRUPT]
        assert not false_corrupt, false_corrupt[:3]
        revisions = [r for _, r, _ in out]
        assert revisions == sorted(revisions)  # a reader never sees the chain go backwards
        assert all(state == r for _, r, state in out)  # check and fold always from one read
    distinct = {r for out in seen for _, r, _ in out}
    assert len(distinct) > 20, "the readers did not interleave with the writer"


async def test_a_truncated_chain_still_reads_corrupt_after_the_one_retry(tmp_path: Path) -> None:
    await three_records(tmp_path)
    _drop_last(tmp_path)
    store = make_store(tmp_path)
    with capture_logs() as logs:
        view = store.read()
        assert (view.check.verdict, view.check.fault) == (Verdict.CORRUPT, Fault.SHORTER_THAN_ANCHOR)
        assert store.chain.full_reads == 2  # the first read and exactly one confirmation
        assert store.read() is view and store.chain.full_reads == 2  # no spinning on unchanged files
    assert [e["fault"] for e in logs if e["event"] == "chain_corrupt"] == ["shorter-than-anchor"]


class _WriterFinishesMidRead(HashChain):
    """A chain whose torn final line is completed between the reader's two looks."""

    def __init__(self, path: str, head_path: str, rest: bytes) -> None:
        super().__init__(path, head_path, len)
        self.rest = rest

    def _snapshot(self) -> ChainCheck:
        check = super()._snapshot()
        if self.rest:
            with open(self.path, "ab") as handle:
                handle.write(self.rest)
            self.rest = b""
        return check


async def test_a_torn_line_completed_before_the_second_read_reads_verified(tmp_path: Path) -> None:
    await three_records(tmp_path)
    lines = chain_lines(tmp_path)
    last_anchor = (tmp_path / ANCHOR_FILE).read_bytes()
    (tmp_path / ANCHOR_FILE).write_bytes(encode_anchor(2, json.loads(lines[1])["hash"]))
    (tmp_path / CHAIN_FILE).write_bytes(b"".join(lines[:2]) + lines[2][:25])  # mid-append
    chain = _WriterFinishesMidRead(str(tmp_path / CHAIN_FILE), str(tmp_path / ANCHOR_FILE), lines[2][25:])
    with capture_logs() as logs:
        check = chain.read().check
    assert (check.verdict, check.revision, chain.full_reads) == (Verdict.VERIFIED, 3, 2)
    assert not [e for e in logs if e["event"] == "chain_corrupt"]
    (tmp_path / ANCHOR_FILE).write_bytes(last_anchor)
    assert os.path.getsize(tmp_path / CHAIN_FILE) == sum(map(len, lines))
