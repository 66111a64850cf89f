"""Heartbeats, authenticated (SPEC §19): a host is live on a heartbeat the fleet secret vouches for.

A heartbeat is two writes: the heartbeat script puts Redis's time in `{f}:hosts:seen` (the one
clock every host agrees on) and answers it; the host then seals that time in `{f}:hosts:beat`
(`<ms>:<mac>`, the MAC over host id and time, key `entry/heartbeat`). A Redis writer without the
secret can move a score in `hosts:seen` but cannot seal it, so a reader that decides who is live
— the fleet view and `hosts_live`, the hosts a revocation waits for, the data plane's own standing
(whose lapse holds its ceilinged accounts) — takes a host's last heartbeat as the older of the
score and the sealed time: a forged score makes no dead host live and lifts no hold. A score that
says live without a seal that does (missing, not decodable, a MAC that does not verify, or a
sealed time a TTL older) is rejected and counted (`heartbeat`), like every other entry.

The reaper keeps reading the scores inside its script (Redis cannot check an HMAC): a writer who
forges them can keep a dead host's holders held, which is the denial of service SPEC §19 leaves
to Redis's access control, never a ceiling exceeded. Without the secret (a data plane started
without `GATEWAY_FLEET_SECRET_FILE`) the scores are read as they are.
"""

from __future__ import annotations

from shared.fleet.entries import EntryKind, FleetEntries, Why

MAX_DIGITS = 15  # ms since the epoch: 13 digits until the year 2286


def seal(entries: FleetEntries, host_id: str, at_ms: int) -> str:
    """The `hosts:beat` value that vouches for `host_id`'s heartbeat at `at_ms` (Redis's clock)."""
    return f"{at_ms}:{entries.mac(EntryKind.HEARTBEAT, [host_id, at_ms])}"


def parse(raw: bytes) -> tuple[int, str] | None:
    """`<ms>:<mac>` strictly, or None (not ASCII, not two parts, not a decimal time)."""
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    at, sep, tag = text.partition(":")
    if not sep or not at.isdigit() or len(at) > MAX_DIGITS or (len(at) > 1 and at[0] == "0"):
        return None
    return int(at), tag


def verified_seen(
    entries: FleetEntries | None, key: str, host_id: str, score_ms: int, raw: bytes | None, now_ms: int, ttl_ms: int
) -> int | None:
    """The last heartbeat of `host_id` a reader believes: the older of its score and its sealed
    time; None when no seal vouches for it. A score that says live with no seal that does is
    rejected and counted (`key` names it in the log)."""
    if entries is None:
        return score_ms
    parsed = None if raw is None else parse(raw)
    if parsed is not None and entries.valid(EntryKind.HEARTBEAT, [host_id, parsed[0]], parsed[1]):
        seen = min(score_ms, parsed[0])
        if now_ms - score_ms <= ttl_ms < now_ms - seen:
            entries.reject(EntryKind.HEARTBEAT, key, Why.MAC)  # fresh score, stale seal: forged
        return seen
    if now_ms - score_ms <= ttl_ms:
        entries.reject(EntryKind.HEARTBEAT, key, Why.DECODE if raw is not None and parsed is None else Why.MAC)
    return None
