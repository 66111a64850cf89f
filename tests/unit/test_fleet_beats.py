"""Sealed heartbeats (SPEC §19), by table: which last heartbeat a reader believes from a score in
`hosts:seen` and a seal in `hosts:beat`, and when it counts a forged one."""

from __future__ import annotations

import secrets

import pytest

from shared.fleet import beats
from shared.fleet.entries import EntryKind, FleetEntries
from shared.fleet.secret import FleetSecret, Keyring

TTL = 3000
NOW = 1_800_000_010_000
HOST = "gw-b"
ENTRIES = FleetEntries(Keyring(FleetSecret(secrets.token_bytes(32)), "f"))
OTHER = FleetEntries(Keyring(FleetSecret(secrets.token_bytes(32)), "f"))  # a writer without the secret


def sealed(at: int, entries: FleetEntries = ENTRIES, host: str = HOST) -> bytes:
    return beats.seal(entries, host, at).encode()


CASES = [
    # name, score, seal, believed seen, rejected
    ("fresh score, its own seal", NOW - 100, sealed(NOW - 100), NOW - 100, False),
    ("score ahead of its seal (between the two writes)", NOW - 100, sealed(NOW - 1200), NOW - 1200, False),
    ("forged fresh score over a stale seal", NOW - 100, sealed(NOW - 9000), NOW - 9000, True),
    ("a seal ahead of the score is held to the score", NOW - 2000, sealed(NOW - 50), NOW - 2000, False),
    ("fresh score, no seal", NOW - 100, None, None, True),
    ("fresh score, a seal made without the secret", NOW - 100, sealed(NOW - 100, OTHER), None, True),
    ("fresh score, another host's seal", NOW - 100, sealed(NOW - 100, host="gw-a"), None, True),
    ("fresh score, an undecodable seal", NOW - 100, b"\xff:zz", None, True),
    ("fresh score, a seal with a padded time", NOW - 100, b"0" + sealed(NOW - 100), None, True),
    ("stale score, no seal: simply not live", NOW - 9000, None, None, False),
]


@pytest.mark.parametrize("name,score,raw,seen,rejected", CASES, ids=[c[0] for c in CASES])
def test_verified_seen(name: str, score: int, raw: bytes | None, seen: int | None, rejected: bool) -> None:
    before = ENTRIES.rejected[EntryKind.HEARTBEAT]
    assert beats.verified_seen(ENTRIES, "k", HOST, score, raw, NOW, TTL) == seen
    assert ENTRIES.rejected[EntryKind.HEARTBEAT] - before == (1 if rejected else 0)


def test_without_the_secret_the_score_is_read_as_it_is() -> None:
    assert beats.verified_seen(None, "k", HOST, NOW - 100, None, NOW, TTL) == NOW - 100


@pytest.mark.parametrize("raw", [b"", b"123", b"12a:x", b":abc", "é:x".encode(), b"1" * 16 + b":x"])
def test_parse_refuses_what_is_not_a_seal(raw: bytes) -> None:
    assert beats.parse(raw) is None
