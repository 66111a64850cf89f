"""Fleet mode's decisions (SPEC §16), pure: what a host does about its standing, whether it may
rely on the shared state, which restored leases a revocation it missed ends, and the per-host
rows of the read plane.

Rule: a host admits nothing new on shared state it cannot vouch for. Its heartbeat's standing
(`shared.codes.Standing`) names the repair due before it may admit again (`REPAIRS`, a table the
tests walk), and `fleet_state` is the one answer to "is the fleet's state available to this
host now", read by the accounts view, the fleet view and the metrics alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum

import msgspec

from shared.codes import EndReason, FleetState, Standing


class Repair(StrEnum):
    """What a host must do about its standing before it admits new holders again."""

    NONE = "none"  # live: nothing to repair
    END_RELEASED = "end-released"  # declared dead meanwhile: end the leases whose holders were released
    REREGISTER = "reregister"  # Redis lost its data: re-register live holders (the ceiling honoured),
    #                                end the refused ones, let go of the rest, re-seed the chains
    FAIL_CLOSED = "fail-closed"  # another instance holds the host id: hold every mint, end every lease


REPAIRS: dict[Standing, Repair] = {
    Standing.LIVE: Repair.NONE,
    Standing.REAPED: Repair.END_RELEASED,
    Standing.STATE_LOST: Repair.REREGISTER,
    Standing.SUPERSEDED: Repair.FAIL_CLOSED,
}

# Why a lease ended by each repair ends (`lease_ended`'s reason).
END_REASONS: dict[Repair, EndReason] = {
    Repair.END_RELEASED: EndReason.HOST_REAPED,
    Repair.REREGISTER: EndReason.REREGISTRATION_REFUSED,
    Repair.FAIL_CLOSED: EndReason.HOST_SUPERSEDED,
}


def repair_for(standing: Standing) -> Repair:
    return REPAIRS[standing]


def fleet_state(reachable: bool, standing: Standing | None, registered: bool) -> FleetState:
    """Available only while Redis answers, the last heartbeat found this host live, and its
    holders are registered in the fleet's current incarnation (so it admits new ones)."""
    if reachable and standing == Standing.LIVE and registered:
        return FleetState.AVAILABLE
    return FleetState.UNAVAILABLE


def may_admit(
    now_ms: int, earliest_ms: int, latest_ms: int, expected: frozenset[str], registered: frozenset[str]
) -> bool:
    """After Redis lost its data, may this host admit new holders?

    Not before `earliest_ms` (one beat after it noticed the loss: by then every host live at the
    loss has noticed it too, re-claimed its id and so shows live again), then once every host in
    `expected` (the hosts live before the loss and those live now) re-registered its own holders
    in this incarnation of the data (`registered`); and at the latest at `latest_ms` (a host TTL
    and a beat: a host silent that long is dead and holds nothing). Before that, a host that
    recovered first could fill an account its siblings' live leases already fill."""
    if now_ms >= latest_ms:
        return True
    return now_ms >= earliest_ms and expected <= registered


def reregistration_order(key_ids: Iterable[str]) -> list[str]:
    """Oldest first (key ids are ULIDs: time-ordered), so a full ceiling refuses the newest."""
    return sorted(key_ids)


class RestoredLease(msgspec.Struct, frozen=True, kw_only=True):
    key_id: str
    account_id: str
    minted_at_ms: int  # the key id's (ULID's) time, this host's clock


class MissedRevocation(msgspec.Struct, frozen=True, kw_only=True):
    account_id: str
    at_ms: int  # the request's time, Redis's clock


def missed_revocations(leases: Iterable[RestoredLease], requests: Iterable[MissedRevocation]) -> list[str]:
    """The restored leases an account-wide revocation made while this host was down should have
    ended: those of its account minted before it. (Clock skew between this host and Redis moves
    the line by the skew; a lease minted long before a revoke is always ended.)"""
    latest: dict[str, int] = {}
    for request in requests:
        latest[request.account_id] = max(request.at_ms, latest.get(request.account_id, request.at_ms))
    return sorted(
        lease.key_id for lease in leases if lease.account_id in latest and lease.minted_at_ms < latest[lease.account_id]
    )


class HostRow(msgspec.Struct, frozen=True, kw_only=True):
    """One host's share of one account (the accounts view's `hosts`), times in ms."""

    host_id: str
    lease_count: int
    in_flight_count: int
    last_seen_ms: int | None  # its last heartbeat (Redis's clock); None: not live


def host_rows(
    this_host: str,
    now_ms: int,
    live: Mapping[str, int],
    leases: Mapping[str, int],
    in_flight: Mapping[str, int],
    local_in_flight: int,
) -> list[HostRow]:
    """Every live host, and any other host still holding a lease of the account (dead, not yet
    reaped), sorted by id. This host's in-flight count is its own, exact one (the others' are
    what each wrote with its last heartbeat); this host is always listed, seen `now_ms`."""
    hosts = set(live) | {h for h, n in leases.items() if n > 0} | {this_host}
    rows = []
    for host in sorted(hosts):
        seen = now_ms if host == this_host else live.get(host)
        flight = local_in_flight if host == this_host else (in_flight.get(host, 0) if host in live else 0)
        rows.append(HostRow(host_id=host, lease_count=leases.get(host, 0), in_flight_count=flight, last_seen_ms=seen))
    return rows
