"""Control's per-row path over its real ledger: rows of one RPC read are written together and
acknowledged only once they are on disk; route events are projected only when read; a retry
citing a held decision is rejected. (The price memo and the row counts alone:
`tests/unit/test_price_lookup.py`, `tests/unit/test_row_counts.py`.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec

from controlplane.routebook import RouteView
from controlplane.service import ControlService
from controlplane.wiring import Control
from shared.codes import CostReason
from shared.wire import Ack, Acks, AttemptFinished, AttemptRow, AttemptStarted, Lease, Usage
from tests.support.control import make_control


def _control(tmp: Path) -> Control:
    return make_control(tmp, env={"GATEWAY_ANTHROPIC_API_KEY": "x"})


def _service(tmp: Path) -> ControlService:
    return _control(tmp).service


def _row(n: int, **changes: object) -> AttemptRow:
    base = dict(
        attempt_id=f"att_{n:04d}",
        key_id="key_1",
        account_id="legacy-anthropic",
        mint_decision_id=None,
        dispatch_id=None,
        repo_slug="acme/widgets",
        principal_id="p",
        wire="anthropic",
        path="/v1/messages",
        requested_model="claude-sonnet-4-5",
        served_model=None,
        stream=False,
        started_at="2026-11-30T12:00:00.000Z",
        finished_at="2026-11-30T12:00:00.010Z",
        status="completed",
        http_status=200,
        condition=None,
        refusal_reason=None,
        usage=Usage(input_tokens=10, output_tokens=5),
        cost_usd=None,
        cost_reason=None,
        overhead_ms=0.2,
    )
    return AttemptRow(**{**base, **changes})  # type: ignore[arg-type]


class _Conn:
    """Records each Ack (an `Acks` frame as the Acks it carries) with the ledger's lines as they
    were when it was sent; counts the frames."""

    def __init__(self, ledger_path: Path) -> None:
        self.ledger_path = ledger_path
        self.acks: list[tuple[Ack, set[str]]] = []
        self.frames = 0

    def send_nowait(self, message: Ack | Acks, lazy: bool = False) -> None:
        on_disk = {msgspec.json.decode(line)["attempt_id"] for line in self.ledger_path.read_bytes().splitlines()}
        self.frames += 1
        if isinstance(message, Acks):
            self.acks.extend((Ack(req_id=rid, ok=message.ok), on_disk) for rid in message.req_ids)
        else:
            self.acks.append((message, on_disk))


async def test_rows_of_one_read_are_acknowledged_only_once_written(tmp_path: Path) -> None:
    service = _service(tmp_path)
    conn = _Conn(tmp_path / "ledger.jsonl")
    for n in range(8):
        await service.on_message(conn, AttemptFinished(req_id=n, row=_row(n)))  # type: ignore[arg-type]
    assert conn.acks == []  # nothing acknowledged while the batch is being read
    assert (tmp_path / "ledger.jsonl").read_bytes() == b""
    await asyncio.sleep(0)
    assert [ack.req_id for ack, _ in conn.acks] == list(range(8))
    assert conn.frames == 1  # one Acks frame for the whole read (issue 27)
    for ack, on_disk in conn.acks:
        assert ack.ok and f"att_{ack.req_id:04d}" in on_disk
    # A re-sent row (after a reconnect) is acknowledged again and written once.
    await service.on_message(conn, AttemptFinished(req_id=99, row=_row(3)))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert conn.acks[-1][0] == Ack(req_id=99, ok=True)
    lines = (tmp_path / "ledger.jsonl").read_bytes().splitlines()
    assert len(lines) == 8 and msgspec.json.decode(lines[0])["cost_reason"] == str(CostReason.PRICED)


async def test_a_failed_write_is_acknowledged_not_ok_and_written_on_recovery(tmp_path: Path) -> None:
    service = _service(tmp_path)
    conn = _Conn(tmp_path / "ledger.jsonl")
    states: list[bool] = []
    service.link.storage_state = states.append  # type: ignore[method-assign]
    service.ledger._fd = None
    service.ledger.path = str(tmp_path / "missing-dir" / "ledger.jsonl")  # every open fails
    await service.on_message(conn, AttemptFinished(req_id=1, row=_row(1)))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert conn.acks[0][0] == Ack(req_id=1, ok=False) and states == [False]
    service.ledger.path = str(tmp_path / "ledger.jsonl")
    await service.retry_storage()
    assert states == [False, True]
    assert [
        msgspec.json.decode(line)["attempt_id"] for line in (tmp_path / "ledger.jsonl").read_bytes().splitlines()
    ] == ["att_0001"]


async def test_route_events_are_projected_once_and_only_when_read(tmp_path: Path) -> None:
    service = _service(tmp_path)
    conn = _Conn(tmp_path / "ledger.jsonl")
    await service.on_message(conn, AttemptStarted(row=_row(1, status=None, finished_at=None)))  # type: ignore[arg-type]
    await service.on_message(conn, AttemptFinished(req_id=1, row=_row(1)))  # type: ignore[arg-type]
    started, finished = list(service.events.replay)
    assert started._data is None and finished._data is None  # retained, not yet projected
    assert isinstance(finished.data, RouteView) and finished.data is finished.data
    payload = msgspec.json.decode(finished.payload)
    assert payload["attempt_id"] == "att_0001" and payload["cost_reason"] == "priced"
    assert set(payload) == set(RouteView.__struct_fields__)
    assert finished.payload is finished.payload  # encoded once for every reader


async def test_citing_a_held_decision_is_rejected_not_selected_from_its_remembered_outcome(tmp_path: Path) -> None:
    from controlplane.mintshapes import MintV2

    control = _control(tmp_path)  # only the anthropic credential is set: an OpenAI model is held
    service, desk = control.service, control.desk

    def body(**cite: str) -> MintV2:
        return MintV2(
            dispatch_id="d1",
            repo_slug="acme/widgets",
            principal_kind="worker",
            principal_id="p",
            model="gpt-4o",
            **cite,
        )

    held = await desk.mint_v2(body())
    assert (held.status, held.body["refusal_reason"]) == (503, "no-eligible-account")
    held_id = held.body["mint_decision_id"]
    assert await service.decisions.get(held_id) is None  # no lease: only its outcome is remembered
    retry = await desk.mint_v2(body(retry_of_mint_decision_id=held_id))
    assert (retry.status, retry.body["outcome"], retry.body["refusal_reason"]) == (
        409,
        "rejected",
        "fallback-cited-decision-not-selected",
    )
    unknown = await desk.mint_v2(body(retry_of_mint_decision_id="md_never_issued"))
    assert (unknown.status, unknown.body["refusal_reason"]) == (503, "fallback-lineage-unknown")


async def test_a_read_is_settled_at_its_end_and_only_a_settle_that_may_suspend_makes_a_task(tmp_path: Path) -> None:
    """The link's reader calls `read_done` after each read: rows whose settle cannot suspend
    (in-process circuits, no decision's evidence, no hop) are written, folded and acknowledged
    right there, with no task; a read with a decision's evidence is settled by a task, as
    before. Either way, an `Ack` means on disk, and the circuits saw the rows."""
    service = _service(tmp_path)
    conn = _Conn(tmp_path / "ledger.jsonl")
    failing = dict(status="upstream_error", http_status=529, condition="overloaded", usage=None)
    for n in range(3):
        service.handle(conn, AttemptFinished(req_id=n, row=_row(n, **failing)))  # type: ignore[arg-type]
    assert conn.acks == [] and service._settling is None  # nothing settled mid-read
    service.read_done()
    assert service._settling is None  # settled at once: no task
    assert [ack.req_id for ack, _ in conn.acks] == [0, 1, 2] and conn.frames == 1
    assert all(ack.ok and f"att_{ack.req_id:04d}" in on_disk for ack, on_disk in conn.acks)
    assert (await service.circuits.view("legacy-anthropic", 0)).state == "open"  # three in a row
    assert [event.kind for event in service.events.replay][-1] == "circuit"
    service.read_done()  # nothing due: nothing done
    assert conn.frames == 1

    service.handle(conn, AttemptFinished(req_id=7, row=_row(7, mint_decision_id="dec_1")))  # type: ignore[arg-type]
    service.read_done()
    assert service._settling is not None and len(conn.acks) == 3  # a decision's evidence: awaited in a task
    assert await service.settle()
    assert conn.acks[-1][0] == Ack(req_id=7, ok=True) and "att_0007" in conn.acks[-1][1]


async def test_a_row_that_may_start_a_hop_is_never_settled_at_once(tmp_path: Path) -> None:
    """The hopper is idle (`Hopper.idle`) for rows without a condition, gateway-authored rows
    and rows of leases that hop on nothing; a failed row of a dispatch key's lease (`hop_on`)
    is settled by a task, where the hop can run."""
    service = _service(tmp_path)
    idle = service.hooks_idle
    lease = Lease(key_id="key_hops", digest=b"d" * 32, account_id="legacy-anthropic", expires_at_ms=2**62)
    service.keys.add(msgspec.structs.replace(lease, hop_on=("overloaded",)))
    service.keys.add(msgspec.structs.replace(lease, key_id="key_stays"))
    failed = dict(status="upstream_error", condition="overloaded", usage=None)
    assert idle([_row(1), _row(2, key_id="key_hops"), _row(3, key_id="key_stays", **failed)])
    assert idle([_row(4, key_id="key_hops", refusal_reason="budget-exhausted", **failed)])
    assert not idle([_row(5), _row(6, key_id="key_hops", **failed)])
    conn = _Conn(tmp_path / "ledger.jsonl")
    service.handle(conn, AttemptFinished(req_id=6, row=_row(6, key_id="key_hops", **failed)))  # type: ignore[arg-type]
    service.read_done()
    assert service._settling is not None  # the hook runs in a task
    assert await service.settle() and [ack.req_id for ack, _ in conn.acks] == [6]


async def test_a_withdrawn_starts_event_shows_no_price_and_a_recorded_row_stays_the_callers(tmp_path: Path) -> None:
    """Control prices the row it decoded in place (issue 27: no copy per row). The start's event of
    an attempt reported once holds that very row: read after the pricing, it still shows the start
    (no cost, no status). A row handed to `record` is copied first: the caller's stays unpriced."""
    service = _service(tmp_path)
    conn = _Conn(tmp_path / "ledger.jsonl")
    reported = _row(1)
    service.handle(conn, AttemptFinished(req_id=1, row=reported))  # type: ignore[arg-type]
    started, finished = list(service.events.replay)
    assert reported.cost_reason == "priced" and finished.data.cost_reason == "priced"  # type: ignore[attr-defined]
    start = msgspec.json.decode(started.payload)
    assert (start["status"], start["cost_usd"], start["cost_reason"], start["usage"]) == (None, None, None, None)
    mine = _row(2)
    service.record(mine)
    await service.settle()
    assert mine == _row(2) and mine.cost_reason is None
    lines = (tmp_path / "ledger.jsonl").read_bytes().splitlines()
    assert [msgspec.json.decode(line)["cost_reason"] for line in lines] == ["priced", "priced"]
