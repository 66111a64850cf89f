"""What one host publishes for the others, authenticated; what a host reads, believed only then
(SPEC §19).

Every entry a host puts in Redis for the other hosts (a revoke request or acknowledgement, an
event, a window of spend totals, a decision, a rate-limit observation, a circuit, a heartbeat's
seal) carries a MAC over its fields, made with the key of its kind (`Keyring`, `entry/<kind>`). A reader checks the
MAC, decodes into strict types and range-checks every value; an entry that fails any check is
skipped and reported here: logged once (`fleet_entry_rejected`, with its kind, the Redis key
(and entry id) it was read from and why, never its value) and counted by kind
(`leasehold_fleet_entries_rejected_total{kind}`).
A rejected entry never stops the loop that read it: the caller goes on with the next one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Any

from shared.fleet.secret import Keyring, mac, verify
from shared.logging import get_logger

log = get_logger("fleet")

LOGGED_KEYS_MAX = 4096  # (kind, key, why) triples remembered for "logged once"; then forgotten


class EntryKind(StrEnum):
    """The kinds of published entry, each with its own key (the metric's `kind` label)."""

    REVOKE = "revoke"  # a revoke-leases request (stream `{f}:revoke`)
    REVOKE_ACK = "revoke-ack"  # a host's acknowledgement (hash `{f}:revoke:acks:<request>`)
    EVENT = "event"  # an event (channel `{f}:events`)
    SPEND = "spend"  # one window of one host's spend totals (hash `{f}:spend:host:<host>`)
    DECISION = "decision"  # a mint decision (string `{f}:dec:d:<decision>`)
    REGISTERED = "registered"  # a host re-registered after a data loss (set `{f}:registered`): lifts a hold
    HEADROOM = "headroom"  # a rate-limit observation (hash `{f}:headroom`, SPEC §22)
    CIRCUIT = "circuit"  # an account's circuit (string `{f}:circuit:<account>`): may lift a hold
    SOCKETS = "sockets"  # a host's open WebSockets per account (hash `{f}:hosts:sockets:<host>`, §20)
    HEARTBEAT = "heartbeat"  # a heartbeat's seal (hash `{f}:hosts:beat`): makes a host live, lifts a lapse


class Why(StrEnum):
    """Why an entry was rejected (a log field)."""

    MAC = "mac"  # no MAC, or one that does not verify: not written by a host of the fleet
    DECODE = "decode"  # not the entry's shape (not msgpack / JSON, a field missing or extra)
    RANGE = "range"  # a value out of range (a negative or non-finite cost, an unknown kind)


class FleetEntries:
    """One host's MACs for what it publishes, and the rejection count of what it read."""

    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring
        self.rejected: dict[EntryKind, int] = {kind: 0 for kind in EntryKind}
        self._logged: set[tuple[str, str, str]] = set()

    def mac(self, kind: EntryKind, fields: Sequence[Any]) -> str:
        return mac(self.keyring.key("entry/" + kind), [str(kind), *fields])

    def valid(self, kind: EntryKind, fields: Sequence[Any], presented: object) -> bool:
        return verify(self.keyring.keys("entry/" + kind), [str(kind), *fields], presented)

    def reject(self, kind: EntryKind, key: str, why: Why) -> None:
        """Count one rejected entry, and log it the first time (key and kind, never the value)."""
        self.rejected[kind] += 1
        seen = (str(kind), key, str(why))
        if seen in self._logged:
            return
        if len(self._logged) >= LOGGED_KEYS_MAX:
            self._logged.clear()
        self._logged.add(seen)
        log.warning("fleet_entry_rejected", kind=str(kind), key=key, why=str(why))


def finite_non_negative(values: Iterable[Any]) -> bool:
    """Every value a finite number >= 0 (a bool is not a number here)."""
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if not math.isfinite(value) or value < 0:
            return False
    return True
