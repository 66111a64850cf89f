"""One rule for whether this data plane may serve a ceilinged account in fleet mode now (SPEC
§16, §19), applied by an HTTP request (`Proxy._admit`), a socket's handshake and each
`response.create` on it (`dataplane/websocket/gates.hold`): the transports never drift apart.

Imported in every mode: it never imports `dataplane/admission.py` (redis-py) at run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.wire import AccountRoute

if TYPE_CHECKING:  # fleet mode only (it brings redis-py)
    from dataplane.admission import FleetAdmission


def fleet_held(fleet: FleetAdmission | None, account: AccountRoute) -> str | None:
    """Why `account`'s requests are refused 503 `fleet-state-unavailable` here now: it has a
    ceiling (a lease or a request one) that this host cannot honour, because its place in the
    fleet lapsed or one of its data-plane fleet loops keeps failing (`FleetAdmission.hold`).
    None when it is served: embedded mode, an account without a ceiling, or a current state."""
    if fleet is None or (account.request_capacity is None and account.lease_capacity is None):
        return None
    return fleet.hold()
