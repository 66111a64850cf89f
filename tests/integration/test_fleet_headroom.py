"""`FleetHeadroom` over a real redis-server (SPEC §22, §16, §19): one host's observation reaches
the other's book, the newest wins whatever order the hosts publish in, and a hostile entry is
skipped and counted without stopping the pull, and a forged observation (no MAC, or one made
without the fleet secret) is not believed. Each test in its own fleet namespace."""

from __future__ import annotations

import secrets

import msgspec

from controlplane.core.headroom import Observation
from controlplane.fleet.headroom import Entry, FleetHeadroom, decode_entry, encode_value, seal
from controlplane.headroom import HeadroomBook
from shared.clock import iso_ms, now_ms
from shared.fleet.entries import EntryKind, FleetEntries, Why
from shared.fleet.secret import FleetSecret, Keyring
from shared.wire import RateLimit, RateLimits
from tests.support.fleet import Fleet
from tests.support.rows import row

ACCOUNTS = frozenset({"team-a", "team-b"})


def host(fleet: Fleet, name: str) -> tuple[HeadroomBook, FleetHeadroom]:
    book = HeadroomBook(ACCOUNTS)
    shared = FleetHeadroom(fleet.client, fleet.keys, name, book, entries=fleet.entries)
    book.observed_listeners.append(shared.note)
    return book, shared


def served(book: HeadroomBook, remaining: int, at_ms: int, account: str = "team-a") -> None:
    stated = RateLimits(
        observed_at=iso_ms(at_ms), tokens=RateLimit(limit=1000, remaining=remaining, reset_at=iso_ms(at_ms + 60_000))
    )
    book.on_row(msgspec.structs.replace(row(iso_ms(at_ms)), account_id=account, rate_limits=stated))


async def test_an_observation_on_one_host_reaches_the_other_and_the_newest_wins(fleet: Fleet) -> None:
    (book_a, a), (book_b, b) = host(fleet, "gw-a"), host(fleet, "gw-b")
    now = now_ms()
    served(book_a, 20, now)
    await a.publish()
    assert await b.pull() == 1
    assert book_b.held["team-a"]["tokens"].remaining == 20
    assert book_b.low("team-a", 10, now + 1)

    served(book_b, 900, now + 50)  # B sees it recover, later
    served(book_a, 5, now + 10)  # A's older answer is published after B's newer one
    await b.publish()
    await a.publish()
    await a.pull()
    await b.pull()
    for book in (book_a, book_b):
        assert book.held["team-a"]["tokens"].remaining == 900
    stored = fleet.admin().hget(fleet.keys.headroom, "team-a/tokens")
    assert stored.startswith(str(now + 50).encode() + b":")


def rejected(fleet: Fleet) -> int:
    return fleet.entries.rejected[EntryKind.HEADROOM]


async def test_hostile_entries_are_skipped_counted_and_the_rest_still_merged(fleet: Fleet) -> None:
    book, shared = host(fleet, "gw-b")
    now = now_ms()
    good = Observation(limit=100, remaining=1, reset_at_ms=now + 30_000, observed_at_ms=now)
    bad_entry = msgspec.msgpack.encode(
        Entry(limit=100, remaining=-5, reset_at_ms=None, observed_at_ms=now, host_id="gw-x")
    )
    e = fleet.entries
    admin = fleet.admin()
    admin.hset(
        fleet.keys.headroom,
        mapping={
            "team-a/tokens": encode_value(e, "team-a", "tokens", good, "gw-a"),
            "team-b/tokens": f"{now}:".encode() + seal(e, "team-b/tokens", bad_entry),  # out of range
            "ghost/tokens": encode_value(e, "ghost", "tokens", good, "gw-a"),  # no such account
            "team-a/bananas": encode_value(e, "team-a", "bananas", good, "gw-a"),  # no such kind
            "team-b/requests": b"not msgpack at all",
            "team-b/input_tokens": b"12:"
            + seal(e, "team-b/input_tokens", msgspec.msgpack.encode([1, 2, 3, 4, "h", "extra"])),
            "team-b/output_tokens": str(now + 1).encode()
            + b":"
            + encode_value(e, "team-b", "output_tokens", good, "gw-a").partition(b":")[2],  # prefix disagrees
            "team-a/requests": encode_value(
                e, "team-a", "requests", msgspec.structs.replace(good, observed_at_ms=now + 3_600_000), "gw-a"
            ),
        },
    )
    assert await shared.pull() == 1
    assert rejected(fleet) == 7
    assert set(book.held) == {"team-a"} and set(book.held["team-a"]) == {"tokens"}
    await shared.pull()  # the loop goes on; each bad field is counted again
    assert rejected(fleet) == 14


async def test_a_forged_low_headroom_is_not_believed_and_is_counted(fleet: Fleet) -> None:
    """SPEC §19: a Redis writer without the fleet secret writes observations of the right shape
    (a low `remaining`, newest by far) with no MAC, with a MAC made under another secret, and
    with a real MAC moved from another field: none reaches the book, so no mint skips team-a."""
    book, shared = host(fleet, "gw-b")
    now = now_ms()
    low = Observation(limit=1000, remaining=0, reset_at_ms=now + 60_000, observed_at_ms=now)
    payload = msgspec.msgpack.encode(
        Entry(limit=1000, remaining=0, reset_at_ms=now + 60_000, observed_at_ms=now, host_id="gw-a")
    )
    outsider = FleetEntries(Keyring(FleetSecret(secrets.token_bytes(32)), fleet.keys.fleet_id))
    fleet.admin().hset(
        fleet.keys.headroom,
        mapping={
            "team-a/tokens": f"{now}:".encode() + payload,  # no MAC
            "team-a/requests": encode_value(outsider, "team-a", "requests", low, "gw-a"),  # another secret
            "team-a/input_tokens": encode_value(fleet.entries, "team-b", "input_tokens", low, "gw-a"),  # moved
            "team-a/output_tokens": f"{now}:".encode() + b"A" * 43 + payload,  # a MAC-shaped nothing
        },
    )
    assert await shared.pull() == 0
    assert rejected(fleet) == 4
    assert book.held.get("team-a", {}) == {}
    assert not book.low("team-a", 10, now + 1)

    served(book, 900, now - 1_000)  # this host's own, older, genuine observation
    await shared.publish()  # the forged field's prefix is newer: Lua keeps it ...
    await shared.pull()
    assert book.held["team-a"]["tokens"].remaining == 900  # ... but the book keeps the genuine one
    assert not book.low("team-a", 10, now + 1)


def test_decode_entry_round_trips_and_refuses_a_bad_host_id() -> None:
    now = now_ms()
    e = FleetEntries(Keyring(FleetSecret(secrets.token_bytes(32)), "t"))
    observation = Observation(limit=None, remaining=7, reset_at_ms=None, observed_at_ms=now)
    value = encode_value(e, "team-a", "requests", observation, "gw-a")
    assert decode_entry(e, b"team-a/requests", value, ACCOUNTS, now) == ("team-a", "requests", observation)
    assert (
        decode_entry(e, b"team-a/requests", encode_value(e, "team-a", "requests", observation, "GW A!"), ACCOUNTS, now)
        == Why.RANGE
    )
    assert (
        decode_entry(e, b"team-a", encode_value(e, "team-a", "", observation, "gw-a")[:-1] + b"x", ACCOUNTS, now)
        == Why.MAC
    )
    assert decode_entry(e, b"team-a/tokens", value, ACCOUNTS, now) == Why.MAC  # bound to its field
    assert decode_entry(e, b"\xff/tokens", value, ACCOUNTS, now) == Why.DECODE
