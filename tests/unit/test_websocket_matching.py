"""Matching a socket's upstream events to their `response.create` (SPEC §20), by what they name."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dataplane.websocket import matching
from dataplane.websocket.matching import Echo, Matcher

TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}


def ev(kind: str, rid: str | None = None, **fields: Any) -> str:
    body: dict[str, Any] = {"type": kind, **fields}
    if rid is not None:
        body["response"] = {"id": rid, "status": "in_progress", **body.pop("response", {})}
    return json.dumps(body)


def play(creates: list[tuple[str, Echo]], script: list[str]) -> list[tuple[str | None, list[str]]]:
    """Each event's attempt (a name) and what it superseded; a terminal ends its attempt."""
    m: Matcher[str] = Matcher()
    for name, echo in creates:
        m.add(name, echo)
    out = []
    for text in script:
        event = matching.named(text)
        terminal = event.type in TERMINAL
        attempt, superseded = m.route(event, terminal)
        for gone in superseded:
            m.remove(gone)
        if terminal and attempt is not None:
            m.remove(attempt)
        out.append((attempt, superseded))
    return out


def test_one_at_a_time_is_in_order() -> None:
    got = play(
        [("a", Echo()), ("b", Echo())],
        [
            ev("response.created", "r1"),
            ev("response.output_text.delta", item_id="m1"),
            ev("response.completed", "r1"),
            ev("response.created", "r2"),
            ev("response.completed", "r2"),
        ],
    )
    assert [a for a, _ in got] == ["a", "a", "a", "b", "b"]
    assert all(s == [] for _, s in got)


def test_interleaved_responses_match_by_response_and_item_id() -> None:
    got = play(
        [("a", Echo()), ("b", Echo())],
        [
            ev("response.created", "r1"),  # FIFO: the first create
            ev("response.output_item.added", item={"id": "m1"}),  # after r1's event: r1's item
            ev("response.created", "r2"),  # FIFO: the next create
            ev("response.output_item.added", item={"id": "m2"}),
            ev("response.output_text.delta", item_id="m1"),  # r1 again: by its item
            ev("response.output_text.delta", item_id="m2"),
            ev("response.completed", "r2"),  # r2 ends first
            ev("response.output_text.delta", item_id="m1"),
            ev("response.completed", "r1"),
        ],
    )
    assert [a for a, _ in got] == ["a", "a", "b", "b", "a", "b", "b", "a", "a"]
    assert all(s == [] for _, s in got)  # interleaved: none dropped


def test_the_created_response_echo_picks_its_create() -> None:
    """OpenAI's response object echoes `metadata` and `previous_response_id`: they name the
    create where the order would not."""
    got = play(
        [("a", Echo(metadata={"turn": "1"})), ("b", Echo(metadata={"turn": "2"}))],
        [
            ev("response.created", "r2", response={"metadata": {"turn": "2"}}),
            ev("response.created", "r1", response={"metadata": {"turn": "1"}}),
            ev("response.in_progress", "r2"),
            ev("response.completed", "r1"),
            ev("response.completed", "r2"),
        ],
    )
    assert [a for a, _ in got] == ["b", "a", "b", "a", "b"]
    got = play(
        [("a", Echo(previous_response_id="r0")), ("b", Echo(previous_response_id="r9"))],
        [ev("response.created", "r2", response={"previous_response_id": "r9"}), ev("response.completed", "r2")],
    )
    assert got[0][0] == "b"


def test_an_error_naming_nothing_ends_the_unanswered_create() -> None:
    got = play(
        [("a", Echo()), ("b", Echo())],
        [
            ev("response.created", "r1"),
            json.dumps({"type": "error", "status": 400, "error": {"code": "x"}}),  # b, not a
            ev("response.output_text.delta", item_id="m1"),
            ev("response.completed", "r1"),
        ],
    )
    assert [a for a, _ in got] == ["a", "b", "a", "a"]
    got = play(
        [("a", Echo()), ("b", Echo(event_id="ev_b"))],
        [  # by event_id
            json.dumps({"type": "error", "error": {"code": "x", "event_id": "ev_b"}}),
            ev("response.created", "r1"),
            ev("response.completed", "r1"),
        ],
    )
    assert [a for a, _ in got] == ["b", "a", "a"]


def test_a_mid_stream_error_ends_its_response() -> None:
    got = play(
        [("a", Echo())],
        [ev("response.created", "r1"), json.dumps({"type": "error", "error": {"code": "server_error"}})],
    )
    assert [a for a, _ in got] == ["a", "a"]


def test_a_continuation_supersedes_the_response_it_continues() -> None:
    got = play(
        [("a", Echo()), ("b", Echo(previous_response_id="r1"))],
        [ev("response.created", "r1"), ev("response.created", "r2"), ev("response.completed", "r2")],
    )
    assert got[1] == ("b", ["a"])  # r1 is over once r2 continues it
    assert got[2] == ("b", [])


def test_a_response_dropped_silently_ends_when_its_successor_does() -> None:
    got = play(
        [("a", Echo()), ("b", Echo())],
        [
            ev("response.created", "r1"),
            ev("response.output_text.delta", item_id="m1"),
            ev("response.created", "r2"),
            ev("response.completed", "r2"),
            ev("response.completed", "r1"),
        ],
    )  # a late end of a dropped response: no one's
    assert got[3] == ("b", ["a"])
    assert got[4] == (None, [])


def test_an_interleaving_socket_never_guesses_a_drop() -> None:
    got = play(
        [("a", Echo()), ("b", Echo())],
        [
            ev("response.created", "r1"),
            ev("response.created", "r2"),
            ev("response.in_progress", "r1"),  # a speaks after b began: interleaved
            ev("response.completed", "r2"),
            ev("response.completed", "r1"),
        ],
    )
    assert got[3] == ("b", []) and got[4] == ("a", [])


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1]",
        '{"type": 3}',
        '{"type": "x", "response": "s"}',
        '{"type": "x", "item": 7, "item_id": 5}',
        '{"response": {"id": 9}}',
    ],
)
def test_hostile_events_match_by_order(text: str) -> None:
    m: Matcher[str] = Matcher()
    m.add("a", Echo())
    assert m.route(matching.named(text), False) == ("a", [])


def test_nothing_in_flight_matches_nothing() -> None:
    assert Matcher[str]().route(matching.named(ev("response.created", "r1")), False) == (None, [])


@pytest.mark.parametrize(
    "data, echo",
    [
        (
            b'{"type":"response.create","previous_response_id":"r1","metadata":{"k":"v"},"event_id":"e"}',
            Echo("r1", {"k": "v"}, "e"),
        ),
        (b'{"type":"response.create","previous_response_id":7,"metadata":[],"event_id":""}', Echo()),
        (b'{"type":"response.create"}', Echo()),
    ],
)
def test_create_echo(data: bytes, echo: Echo) -> None:
    assert matching.create_echo(data) == echo


def test_ids_are_remembered_boundedly() -> None:
    m: Matcher[int] = Matcher()
    for n in range(matching.KEEP_RESPONSES + 50):
        m.add(n, Echo())
        assert m.route(matching.named(ev("response.created", f"r{n}")), False)[0] == n
        m.remove(n)
    assert len(m._by_response) <= matching.KEEP_RESPONSES


def test_an_event_naming_nothing_else_goes_where_its_sequence_number_is_due() -> None:
    got = play(
        [("a", Echo()), ("b", Echo())],
        [
            ev("response.created", "r1", sequence_number=0),
            ev("response.in_progress", "r1", sequence_number=1),
            ev("response.created", "r2", sequence_number=0),
            ev("response.output_item.added", item={"id": "m1"}, sequence_number=2),  # a's, though b spoke last
            ev("response.in_progress", "r2", sequence_number=1),
            ev("response.output_item.added", item={"id": "m2"}, sequence_number=2),  # due only on b
            ev("response.output_text.delta", sequence_number=3),  # both due 3: the last spoken
            ev("response.output_text.delta", item_id="m1", sequence_number=4),
            ev("response.completed", "r1"),
            ev("response.completed", "r2"),
        ],
    )
    assert [a for a, _ in got] == ["a", "a", "b", "a", "b", "b", "b", "a", "a", "b"]


def test_a_response_no_create_asked_for_ends_nothing() -> None:
    got = play(
        [("a", Echo())],
        [
            ev("response.created", "r1"),
            ev("response.completed", "r9"),  # r9: nobody's
            ev("response.output_text.delta", item_id="m1"),
            ev("response.completed", "r1"),
        ],
    )
    assert [a for a, _ in got] == ["a", None, "a", "a"]
