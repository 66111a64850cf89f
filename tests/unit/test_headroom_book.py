"""`HeadroomBook` on a test clock: newest wins per kind, unknown accounts are ignored, and a
`headroom` event marks each floor's crossing — below on a row, recovered on a newer row or when
the reset passes (the tick) — once per crossing."""

from __future__ import annotations

import msgspec
import pytest

from controlplane.events import EventHub, EventKind
from controlplane.headroom import HeadroomBook, supersedes
from shared.clock import iso_ms
from shared.wire import RateLimit, RateLimits
from tests.support.rows import row

T0 = 1_800_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def answered(book: HeadroomBook, account: str, remaining: int, at: int, reset_in: int = 10_000) -> None:
    stated = RateLimits(
        observed_at=iso_ms(at), tokens=RateLimit(limit=100, remaining=remaining, reset_at=iso_ms(at + reset_in))
    )
    book.on_row(msgspec.structs.replace(row(iso_ms(at)), account_id=account, rate_limits=stated))


def headroom_events(hub: EventHub) -> list[tuple]:
    return [
        (e.data.account_id, e.data.floor_percent, e.data.state, tuple(e.data.kinds))  # type: ignore[attr-defined]
        for e in hub.replay
        if e.kind == EventKind.HEADROOM
    ]


def book_with(floors: tuple[int, ...]) -> tuple[HeadroomBook, EventHub, Clock]:
    hub, clock = EventHub(), Clock()
    book = HeadroomBook(frozenset({"a", "b"}), hub, lambda: floors, clock)
    book.refresh_floors()
    return book, hub, clock


def test_each_floor_crossing_is_one_event_and_recovery_comes_with_the_reset() -> None:
    book, hub, clock = book_with((10, 30))
    answered(book, "a", 20, T0)  # below 30, above 10
    answered(book, "a", 19, T0 + 1)  # still below 30: no second event
    assert headroom_events(hub) == [("a", 30, "below", ("tokens",))]
    answered(book, "a", 5, T0 + 2)  # now below 10 too
    assert headroom_events(hub)[-1] == ("a", 10, "below", ("tokens",))
    clock.now = T0 + 5_000
    book.tick()
    assert len(headroom_events(hub)) == 2  # nothing changed before the reset
    clock.now = T0 + 2 + 10_000  # the reset passed
    book.tick()
    assert headroom_events(hub)[-2:] == [("a", 10, "recovered", ()), ("a", 30, "recovered", ())]
    assert not book.low("a", 30, clock.now)


def test_a_newer_answer_lifts_and_an_older_one_is_ignored() -> None:
    book, hub, clock = book_with((10,))
    answered(book, "a", 5, T0)
    answered(book, "a", 90, T0 + 10)
    assert headroom_events(hub) == [("a", 10, "below", ("tokens",)), ("a", 10, "recovered", ())]
    answered(book, "a", 1, T0 + 5)  # an answer older than the one held
    assert book.held["a"]["tokens"].remaining == 90 and len(headroom_events(hub)) == 2


def test_unknown_accounts_and_rows_without_headers_change_nothing() -> None:
    book, hub, _ = book_with((10,))
    answered(book, "ghost", 0, T0)
    book.on_row(row(iso_ms(T0)))
    assert book.held == {} and headroom_events(hub) == []


def test_no_floor_set_means_no_event_and_no_skip() -> None:
    book, hub, clock = book_with(())
    answered(book, "b", 0, T0)
    assert headroom_events(hub) == [] and not book.low("b", 0, clock.now)
    assert book.low("b", 10, clock.now) and book.lifts_at("b", 10, clock.now) == T0 + 10_000


def test_the_gauges_drop_a_kind_whose_reset_passed() -> None:
    book, _, clock = book_with(())
    answered(book, "a", 40, T0)
    families = {f.name: f.samples for f in book.gauges().collect()}
    assert [(s.labels, s.value) for s in families["leasehold_account_ratelimit_remaining"]] == [
        ({"account_id": "a", "kind": "tokens"}, 40)
    ]
    clock.now = T0 + 10_000
    assert all(not f.samples for f in book.gauges().collect())


# ---- lazy folding (no floor set: a row waits until the book is read) ----------------------------


def stated_at(at: int, **kinds: int) -> RateLimits:
    return RateLimits(
        observed_at=iso_ms(at),
        **{kind: RateLimit(limit=100, remaining=left, reset_at=iso_ms(at + 10_000)) for kind, left in kinds.items()},
    )


def test_with_no_floor_a_row_waits_unread_until_the_book_is_read() -> None:
    book, _, _ = book_with(())
    book.on_row(msgspec.structs.replace(row(iso_ms(T0)), account_id="a", rate_limits=stated_at(T0, tokens=7)))
    assert book._pending and not book._held  # nothing folded on the row's path
    assert book.held["a"]["tokens"].remaining == 7 and not book._pending


def test_a_row_that_leaves_out_a_kind_keeps_the_older_rows_observation_of_it() -> None:
    book, _, _ = book_with(())
    for stated in (stated_at(T0, tokens=7, requests=3), stated_at(T0 + 1, tokens=6)):
        book.on_row(msgspec.structs.replace(row(iso_ms(T0)), account_id="a", rate_limits=stated))
    assert {kind: o.remaining for kind, o in book.held["a"].items()} == {"tokens": 6, "requests": 3}


def test_an_older_row_arriving_last_does_not_replace_the_newer_one_unread() -> None:
    book, _, _ = book_with(())
    for stated in (stated_at(T0 + 10, tokens=90), stated_at(T0 + 5, tokens=1)):
        book.on_row(msgspec.structs.replace(row(iso_ms(T0)), account_id="a", rate_limits=stated))
    assert book.held["a"]["tokens"].remaining == 90


NOT_ISO_MS = msgspec.structs.replace(stated_at(T0 + 20, tokens=1), observed_at="2027-01-15T08:00:00+00:00")


@pytest.mark.parametrize(
    ("new", "old", "moot"),
    [
        (stated_at(T0 + 1, tokens=1), stated_at(T0, tokens=2), True),  # newer, same kinds
        (stated_at(T0, tokens=1), stated_at(T0, tokens=2), True),  # a tie: the later row wins
        (stated_at(T0, tokens=1), stated_at(T0 + 1, tokens=2), False),  # older
        (stated_at(T0 + 1, tokens=1, requests=1), stated_at(T0, tokens=2), True),  # more kinds
        (stated_at(T0 + 1, tokens=1), stated_at(T0, tokens=2, requests=2), False),  # a kind left out
        (NOT_ISO_MS, stated_at(T0, tokens=2), False),  # another form: folded, not compared as text
        (stated_at(T0, tokens=2), NOT_ISO_MS, False),
    ],
)
def test_supersedes(new: RateLimits, old: RateLimits, moot: bool) -> None:
    assert supersedes(new, old) is moot
