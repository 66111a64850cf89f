"""The event hub by table: resumption, projection to sanitized models, bounded queues."""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

import msgspec
import pytest
from structlog.testing import capture_logs

from controlplane.circuits import CircuitView
from controlplane.events import (
    PROJECTIONS,
    AccountStateEvent,
    CloseReason,
    EventHub,
    EventKind,
    GapEvent,
    GapReason,
    PolicyEvent,
    parse_event_id,
    resume_from,
)
from controlplane.routebook import RouteView
from shared.wire import AttemptRow, Usage

EPOCH = "e1"


class Resume(NamedTuple):
    name: str
    last_event_id: str | None
    oldest_seq: int | None
    next_seq: int
    expect: tuple[GapReason | None, int]


RESUME_CASES = [
    Resume("fresh reader: live only", None, 1, 11, (None, 11)),
    Resume("fresh reader on an empty hub", None, None, 1, (None, 1)),
    Resume("caught up", f"{EPOCH}-10", 1, 11, (None, 11)),
    Resume("missed three", f"{EPOCH}-7", 1, 11, (None, 8)),
    Resume("resume from zero while 1 is held", f"{EPOCH}-0", 1, 11, (None, 1)),
    Resume("last one before the oldest held", f"{EPOCH}-4", 5, 11, (None, 5)),
    Resume("evicted by one", f"{EPOCH}-3", 5, 11, (GapReason.EVICTED, 5)),
    Resume("evicted long ago", f"{EPOCH}-1", 900, 1924, (GapReason.EVICTED, 900)),
    Resume("future id", f"{EPOCH}-11", 1, 11, (GapReason.NEVER_ISSUED, 1)),
    Resume("another process's id", "e0-5", 1, 11, (GapReason.NEVER_ISSUED, 1)),
    Resume("malformed", "banana", 1, 11, (GapReason.NEVER_ISSUED, 1)),
    Resume("bare number", "7", 1, 11, (GapReason.NEVER_ISSUED, 1)),
    Resume("negative", f"{EPOCH}--1", 1, 11, (GapReason.NEVER_ISSUED, 1)),
    Resume("position zero before anything was issued", f"{EPOCH}-0", None, 1, (None, 1)),
    Resume("an id past an empty hub", f"{EPOCH}-1", None, 1, (GapReason.NEVER_ISSUED, 1)),
]


@pytest.mark.parametrize("case", RESUME_CASES, ids=[c.name for c in RESUME_CASES])
def test_resume_from(case: Resume) -> None:
    assert resume_from(case.last_event_id, EPOCH, case.oldest_seq, case.next_seq) == case.expect


@pytest.mark.parametrize(
    "text,expect",
    [
        ("ab12-7", ("ab12", 7)),
        (" ab12-7 ", ("ab12", 7)),
        ("a-b-3", ("a-b", 3)),
        ("", None),
        (None, None),
        ("-3", None),
        ("ab12-", None),
        ("ab12-x", None),
        ("ab12", None),
    ],
)
def test_parse_event_id(text: str | None, expect: Any) -> None:
    assert parse_event_id(text) == expect


def row(attempt_id: str = "att_1", **changes: Any) -> AttemptRow:
    base = AttemptRow(
        attempt_id=attempt_id,
        key_id="01KEY",
        account_id="legacy-anthropic",
        mint_decision_id=None,
        dispatch_id=None,
        repo_slug="acme/app",
        principal_id="w-1",
        wire="anthropic",
        path="/v1/messages",
        requested_model="claude-sonnet-4-6",
        served_model=None,
        stream=True,
        started_at="2026-01-01T00:00:00.000Z",
        finished_at=None,
        status=None,
        http_status=None,
        condition=None,
        refusal_reason=None,
        usage=None,
        cost_usd=None,
        cost_reason=None,
        overhead_ms=None,
        principal_kind="worker",
        bytes_out=99,
    )
    return msgspec.structs.replace(base, **changes)


FORBIDDEN_NAME_PARTS = ("token", "secret", "api_key", "digest", "fingerprint")


def test_no_event_model_declares_a_secret_shaped_field() -> None:
    models = [RouteView, CircuitView, AccountStateEvent, PolicyEvent, GapEvent]
    names = [f for model in models for f in model.__struct_fields__]
    assert "attempt_id" in names and "account_id" in names  # non-vacuous: the join keys are there
    offenders = [n for n in names if any(part in n.lower() for part in FORBIDDEN_NAME_PARTS)]
    assert offenders == []
    assert set(PROJECTIONS) == set(EventKind)  # every kind has a model


def test_route_events_carry_the_route_view_not_the_row() -> None:
    hub = EventHub(epoch=EPOCH)
    started = hub.publish("route.started", row())
    finished = hub.publish(
        "route.finished",
        row(status="completed", usage=Usage(input_tokens=3, output_tokens=2), cost_usd=0.5, cost_reason="priced"),
    )
    assert started is not None and finished is not None
    assert isinstance(started.data, RouteView) and isinstance(finished.data, RouteView)
    decoded = msgspec.json.decode(finished.payload)
    assert set(decoded) == set(RouteView.__struct_fields__)
    assert "bytes_out" not in decoded and "principal_kind" not in decoded  # row-only fields stay home
    assert decoded["usage"] == {
        "input_tokens": 3,
        "output_tokens": 2,
        "cache_read_tokens": 0,
        "cache_creation_tokens": 0,
    }
    assert (started.id, finished.id) == (f"{EPOCH}-1", f"{EPOCH}-2")


def test_a_start_published_with_its_finished_row_shows_the_start() -> None:
    """An attempt reported once (its start withdrawn by the data plane) publishes route.started
    with its finished row; the event shows the row as its start was, derived on first read."""
    done = row(
        status="completed",
        finished_at="2026-01-01T00:00:01.000Z",
        http_status=200,
        served_model="m-2026",
        usage=Usage(input_tokens=3, output_tokens=2),
        cost_usd=0.5,
        cost_reason="priced",
        overhead_ms=1.5,
        first_byte_ms=2.5,
    )
    hub = EventHub(epoch=EPOCH)
    started = hub.publish("route.started", done)
    assert started is not None
    assert started.data == hub.publish("route.started", row()).data  # type: ignore[union-attr]
    assert msgspec.json.decode(started.payload)["status"] is None
    finished = hub.publish("route.finished", done)
    assert finished is not None and finished.data.status == "completed"  # type: ignore[attr-defined]


def test_models_drop_keys_they_do_not_declare() -> None:
    hub = EventHub(epoch=EPOCH)
    event = hub.publish(
        "circuit",
        {
            "account_id": "a",
            "state": "open",
            "opened_at": "t",
            "retry_at": "u",
            "opened_by": "rate-limited",
            "token": "lhgw_leak.secret",
        },
    )
    assert event is not None and b"lhgw_leak" not in event.payload and b"token" not in event.payload
    admin = hub.publish(
        "account.state",
        {"account_id": "a", "action": "set-state", "state": "draining", "revision": 3, "credential": "sk-ant-leak"},
    )
    assert admin is not None and msgspec.json.decode(admin.payload)["revision"] == 3
    assert b"sk-ant-leak" not in admin.payload


@pytest.mark.parametrize(
    "kind,data",
    [
        ("route.exploded", {}),  # unknown kind
        ("circuit", {"state": "open"}),  # missing account_id
        ("policy", {"revision": "seven"}),  # wrong type
        ("route.started", {"attempt_id": "x"}),  # not a row
    ],
)
def test_unpublishable_events_are_logged_never_raised(kind: str, data: Any) -> None:
    hub = EventHub(epoch=EPOCH)
    with capture_logs() as logs:
        assert hub.publish(kind, data) is None
    assert [entry["event"] for entry in logs] == ["event_unpublishable"]
    assert hub.published == 0 and len(hub.replay) == 0
    assert hub.publish("policy", {"name": "platform", "revision": 1}).id == f"{EPOCH}-1"  # no id was burnt


def test_replay_is_bounded_and_an_evicted_id_gets_a_gap_then_what_is_held() -> None:
    hub = EventHub(replay_size=4, epoch=EPOCH)
    for i in range(10):
        hub.publish("policy", {"name": "platform", "revision": i})
    assert [e.seq for e in hub.replay] == [7, 8, 9, 10]
    _, backlog = hub.subscribe(f"{EPOCH}-2")
    assert [e.kind for e in backlog] == [EventKind.GAP] + [EventKind.POLICY] * 4
    gap = backlog[0]
    assert gap.data.reason == "evicted" and gap.data.last_event_id == f"{EPOCH}-2"
    assert gap.data.oldest_retained_id == f"{EPOCH}-7"
    assert gap.id == f"{EPOCH}-6"  # resuming from the gap's id replays from the oldest held, no gap
    _, again = hub.subscribe(gap.id)
    assert [e.seq for e in again] == [7, 8, 9, 10]
    _, caught_up = hub.subscribe(f"{EPOCH}-8")
    assert [e.seq for e in caught_up] == [9, 10]


def test_a_reader_that_never_drains_is_dropped_at_its_bound() -> None:
    hub = EventHub(queue_max=8, epoch=EPOCH)
    stalled, _ = hub.subscribe(None, peer="10.9.9.9")
    keeping_up, _ = hub.subscribe(None, peer="127.0.0.1")
    closed: list[CloseReason] = []
    stalled.on_close = closed.append
    with capture_logs() as logs:
        for i in range(100):
            hub.publish("policy", {"name": "platform", "revision": i})
            keeping_up.queue.clear()  # drained, as a live reader would
            assert len(stalled.queue) <= 8
    assert closed == [CloseReason.QUEUE_FULL]
    assert stalled.closed == CloseReason.QUEUE_FULL and len(stalled.queue) == 0  # memory released
    assert hub.subscribers == {keeping_up}
    assert hub.queue_high_water == 8  # it did fill, and no further
    assert hub.closed_by_reason[CloseReason.QUEUE_FULL] == 1
    dropped = [entry for entry in logs if entry["event"] == "event_subscriber_dropped"]
    assert len(dropped) == 1
    assert dropped[0]["reason"] == "queue-full" and dropped[0]["peer"] == "10.9.9.9"
    assert dropped[0]["queued"] == 8


def test_listeners_see_sanitized_events_and_one_failing_listener_harms_no_other() -> None:
    hub = EventHub(epoch=EPOCH)
    seen: list[str] = []
    hub.listen(lambda event: (_ for _ in ()).throw(RuntimeError("listener bug")))
    hub.listen(lambda event: seen.append(type(event.data).__name__))
    with capture_logs() as logs:
        assert hub.publish("route.finished", row(status="completed")) is not None
    assert seen == ["RouteView"]
    assert [entry["event"] for entry in logs] == ["event_listener_failed"]


def test_a_listener_hears_only_the_kinds_it_asked_for_in_the_order_listeners_came() -> None:
    hub = EventHub(epoch=EPOCH)
    heard: list[tuple[str, str]] = []
    hub.listen(lambda event: heard.append(("all", str(event.kind))))
    hub.listen(lambda event: heard.append(("state", str(event.kind))), frozenset({EventKind.ACCOUNT_STATE}))
    hub.listen(lambda event: heard.append(("all-2", str(event.kind))))
    hub.publish_row(EventKind.ROUTE_STARTED, row())
    hub.publish(EventKind.ACCOUNT_STATE, {"account_id": "a", "state": "disabled"})
    assert heard == [
        ("all", "route.started"),
        ("all-2", "route.started"),
        ("all", "account.state"),
        ("state", "account.state"),
        ("all-2", "account.state"),
    ]
    assert [event.seq for event in hub.replay] == [1, 2]


async def test_next_batch_waits_for_events_and_returns_empty_once_closed() -> None:
    hub = EventHub(epoch=EPOCH)
    reader, _ = hub.subscribe(None)
    waiting = asyncio.create_task(reader.next_batch())
    await asyncio.sleep(0)
    assert not waiting.done()
    hub.publish("policy", {"name": "platform", "revision": 1})
    hub.publish("policy", {"name": "platform", "revision": 2})
    batch = await asyncio.wait_for(waiting, 1)
    assert [e.seq for e in batch] == [1, 2]
    closing = asyncio.create_task(reader.next_batch())
    await asyncio.sleep(0)
    hub.close_all()
    assert await asyncio.wait_for(closing, 1) == []
    assert reader.closed == CloseReason.SHUTDOWN and hub.subscribers == set()
