"""`FleetHeadroom` over a real redis-server (SPEC §22, §16, §19): one host's observation reaches
the other's book, the newest wins whatever order the hosts publish in, and a hostile entry is
skipped and counted without stopping the pull. Each test in its own fleet namespace."""

from __future__ import annotations

import msgspec

from controlplane.core.headroom import Observation
from controlplane.fleet.headroom import Entry, FleetHeadroom, decode_entry, encode_value
from controlplane.headroom import HeadroomBook
from shared.clock import iso_ms, now_ms
from shared.wire import RateLimit, RateLimits
from tests.support.fleet import Fleet
from tests.support.rows import row

ACCOUNTS = frozenset({"team-a", "team-b"})


def host(fleet: Fleet, name: str) -> tuple[HeadroomBook, FleetHeadroom]:
    book = HeadroomBook(ACCOUNTS)
    shared = FleetHeadroom(fleet.client, fleet.keys, name, book)
    book.observed_listeners.append(shared.note)
    return book, shared


def served(book: HeadroomBook, remaining: int, at_ms: int, account: str = "team-a") -> None:
    stated = RateLimits(observed_at=iso_ms(at_ms),
                        tokens=RateLimit(limit=1000, remaining=remaining, reset_at=iso_ms(at_ms + 60_000)))
    book.on_row(msgspec.structs.replace(row(iso_ms(at_ms)), account_id=account, rate_limits=stated))


async def test_an_observation_on_one_host_reaches_the_other_and_the_newest_wins(fleet: Fleet) -> None:
    (book_a, a), (book_b, b) = host(fleet, "gw-a"), host(fleet, "gw-b")
    now = now_ms()
    served(book_a, 20, now)
    await a.publish()
    assert await b.pull() == 1
    assert book_b.held["team-a"]["tokens"].remaining == 20
    assert book_b.low("team-a", 10, now + 1)

    served(book_b, 900, now + 50)            # B sees it recover, later
    served(book_a, 5, now + 10)              # A's older answer is published after B's newer one
    await b.publish()
    await a.publish()
    await a.pull()
    await b.pull()
    for book in (book_a, book_b):
        assert book.held["team-a"]["tokens"].remaining == 900
    stored = fleet.admin().hget(fleet.keys.headroom, "team-a/tokens")
    assert stored.startswith(str(now + 50).encode() + b":")


async def test_hostile_entries_are_skipped_counted_and_the_rest_still_merged(fleet: Fleet) -> None:
    book, shared = host(fleet, "gw-b")
    now = now_ms()
    good = Observation(limit=100, remaining=1, reset_at_ms=now + 30_000, observed_at_ms=now)
    bad_entry = msgspec.msgpack.encode(Entry(limit=100, remaining=-5, reset_at_ms=None, observed_at_ms=now,
                                             host_id="gw-x"))
    admin = fleet.admin()
    admin.hset(fleet.keys.headroom, mapping={
        "team-a/tokens": encode_value(good, "gw-a"),
        "team-b/tokens": f"{now}:".encode() + bad_entry,                        # out of range
        "ghost/tokens": encode_value(good, "gw-a"),                              # no such account
        "team-a/bananas": encode_value(good, "gw-a"),                            # no such kind
        "team-b/requests": b"not msgpack at all",
        "team-b/input_tokens": b"12:" + msgspec.msgpack.encode([1, 2, 3, 4, "h", "extra"]),
        "team-b/output_tokens": str(now + 1).encode() + b":" + encode_value(good, "gw-a").partition(b":")[2],
        "team-a/requests": encode_value(msgspec.structs.replace(good, observed_at_ms=now + 3_600_000), "gw-a"),
    })
    assert await shared.pull() == 1
    assert shared.rejected == 7
    assert set(book.held) == {"team-a"} and set(book.held["team-a"]) == {"tokens"}
    await shared.pull()                      # the loop goes on; each bad field is counted again
    assert shared.rejected == 14


def test_decode_entry_round_trips_and_refuses_a_bad_host_id() -> None:
    now = now_ms()
    observation = Observation(limit=None, remaining=7, reset_at_ms=None, observed_at_ms=now)
    value = encode_value(observation, "gw-a")
    assert decode_entry(b"team-a/requests", value, ACCOUNTS, now) == ("team-a", "requests", observation)
    assert decode_entry(b"team-a/requests", encode_value(observation, "GW A!"), ACCOUNTS, now) is None
    assert decode_entry(b"team-a", value, ACCOUNTS, now) is None
    assert decode_entry(b"\xff/tokens", value, ACCOUNTS, now) is None
