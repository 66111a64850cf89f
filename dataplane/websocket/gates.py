"""The request gates a socket passes: at its handshake, and again for each `response.create`.

The same rules, in the same order, as an HTTP request on the lease (`Proxy._serve`, SPEC §12,
§16–§18): a dispatch key being moved (503 `fallback-pending`), the budget gate (429
`budget-exhausted` / 403 `model-unpriced`), a ceiling this host cannot honour now (503
`fleet-state-unavailable`: its fleet place lapsed or a fleet loop keeps failing; the one rule
the HTTP proxy applies, `fleethold.fleet_held`), then a request slot (429
`request-capacity-exhausted`, local or fleet-wide). `standing` says whether an open socket still
has its lease's rights (revoke, expiry, a hop, its account disabled, a spent budget, the drain),
and with which close code it ends when it has not (SPEC §20); `disabled` also refuses a
handshake on a disabled account.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from dataplane.budget import budget_hold
from dataplane.fleethold import fleet_held
from dataplane.leases import LeaseReplica
from dataplane.scope import reach
from shared.capacity import CapacityTable, StateUnavailable
from shared.codes import HTTP_STATUS, Refusal
from shared.wire import AccountRoute, Lease

if TYPE_CHECKING:
    from dataplane.admission import FleetAdmission

# RFC 6455 close codes the relay ends a socket with (SPEC §20).
GOING_AWAY = 1001  # SIGTERM, after the drain
POLICY_VIOLATION = 1008  # the lease's rights were lost: revoke, expiry, disable, budget
INTERNAL_ERROR = 1011  # the upstream socket failed
SERVICE_RESTART = 1012  # a dispatch hop: reconnect, and the new handshake reaches the new account


class Refused(NamedTuple):
    code: Refusal
    status: int
    message: str
    retry_after_s: float | None = None


def refused(code: Refusal, message: str, retry_after_s: float | None = None, status: int | None = None) -> Refused:
    return Refused(code, status or HTTP_STATUS[code], message, retry_after_s)


def hold(
    replica: LeaseReplica,
    lease: Lease,
    account: AccountRoute,
    model: str | None,
    now_ms: int,
    fleet: FleetAdmission | None,
) -> Refused | None:
    """The gates before a slot is taken, as for an HTTP request (no await: see `Proxy._serve`)."""
    if reach(model, True, account.models).refused:
        served = ", ".join(account.models or ())
        return refused(
            Refusal.MODEL_NOT_PERMITTED,
            f"model {str(model)[:128]!r} is not served by account {account.id} (its models: {served})",
        )
    if lease.hop_on and replica.is_moving(lease):
        return refused(
            Refusal.FALLBACK_PENDING,
            "the gateway is moving this dispatch to another account; reconnect in a second",
            retry_after_s=1,
        )
    if lease.budgeted:
        found = budget_hold(lease, model, now_ms, replica.priced)
        if found is not None:
            return Refused(found.code, found.status, found.message, found.retry_after_s)
    held = fleet_held(fleet, account)  # the HTTP proxy's own rule (`Proxy._admit`)
    if held is not None:
        return refused(
            Refusal.FLEET_STATE_UNAVAILABLE,
            f"{held}: account {account.id}'s fleet-wide ceiling cannot be honoured here",
            retry_after_s=1,
        )
    return None


async def take_slot(
    capacity: CapacityTable, fleet: FleetAdmission | None, account: AccountRoute, holder: str
) -> Refused | None:
    """A request slot for `holder` (released with `give_slot`), or why there is none."""
    if fleet is not None and account.request_capacity is not None:
        try:
            admitted = await fleet.reserve(account.id, holder, account.request_capacity)
        except StateUnavailable:
            return refused(
                Refusal.FLEET_STATE_UNAVAILABLE,
                f"account {account.id}'s fleet-wide request ceiling cannot be checked now",
                retry_after_s=1,
            )
    else:
        admitted = capacity.reserve(account.id, holder, account.request_capacity)
    if not admitted:
        return refused(
            Refusal.REQUEST_CAPACITY_EXHAUSTED, f"account {account.id} is at its request capacity", retry_after_s=1
        )
    return None


def give_slot(capacity: CapacityTable, fleet: FleetAdmission | None, holder: str) -> None:
    capacity.release(holder)
    if fleet is not None:
        fleet.release_soon(holder)


class Standing(NamedTuple):
    close_code: int
    refusal: Refused


def standing(replica: LeaseReplica, lease: Lease, now_ms: int, draining: bool) -> Standing | None:
    """None while the socket's lease keeps its rights; else how the socket ends (SPEC §20)."""
    if draining:
        return Standing(
            GOING_AWAY, refused(Refusal.GATEWAY_SHUTDOWN, "the gateway is shutting down; reconnect", retry_after_s=1)
        )
    current = replica.lookup_by_key(lease.key_id)
    if current is None or current.expires_at_ms <= now_ms:
        return Standing(POLICY_VIOLATION, refused(Refusal.UNKNOWN_KEY, "the virtual key was revoked or expired"))
    if lease.hop_on and replica.is_moving(lease):  # before a disable: the key's new account serves it
        return Standing(
            SERVICE_RESTART,
            refused(
                Refusal.FALLBACK_PENDING,
                "the gateway moved this dispatch to another account; reconnect",
                retry_after_s=1,
            ),
        )
    off = disabled(replica, lease.account_id)
    if off is not None:
        return Standing(POLICY_VIOLATION, off)
    if current.budget_retry_at_ms is not None and now_ms < current.budget_retry_at_ms:
        found = budget_hold(current, None, now_ms, replica.priced)
        if found is not None:
            return Standing(POLICY_VIOLATION, Refused(found.code, found.status, found.message, found.retry_after_s))
    return None


def disabled(replica: LeaseReplica, account_id: str) -> Refused | None:
    """An operator disabled the socket's account (SPEC §9): a loss of the lease's rights on a
    socket (SPEC §20), refused `administrative-disabled` (its status as a renewal's, 409). A
    drain is not one: it stops new mints only. HTTP requests on the account's live leases are
    not refused (SPEC stops the account's mints and renewals, not its leases)."""
    if account_id not in replica.disabled:
        return None
    return refused(
        Refusal.ADMINISTRATIVE_DISABLED,
        f"account {account_id} was disabled by an operator: this socket takes no new response; mint a new key",
    )
