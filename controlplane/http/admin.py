"""Administrative overlay routes (SPEC §9): read with scope `read`, mutate with scope `admin`.

- `GET /control/v2/accounts/admin`: revision, chain verdict and reason, each account's state,
  and the overlay (the accounts some record set).
- `PATCH /control/v2/accounts/{id}/state` `{state, reason, actor?, expected_revision?}`
- `POST /control/v2/accounts/{id}/revoke-leases` `{reason, actor?, expected_revision?}`; the
  answer's `revoked` counts the leases ended, and `unacknowledged_hosts` names the live fleet
  hosts that did not acknowledge within 5 s (SPEC §16; `[]` in embedded mode)
- `GET /control/v2/accounts/audit`: every record and the chain verdict.

Optimistic concurrency is `expected_revision` in the body (409 naming the current revision on a
mismatch), one convention with the policy store. Without it the mutation applies at whatever
revision is current, and the response says so. The record carries the caller's `actor` as the
caller's claim, and `actor_authenticated_by` naming the token that actually authenticated the
request: the gateway has shared bearer tokens, not identities, and never presents a caller's
string as an authenticated identity.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from controlplane.http.appkeys import ADMIN_STORE, LEASE_REVOKER
from controlplane.http.common import authenticated_by, json_response, read_json, refuse_secret_shapes, requires
from controlplane.stores.admin import AccountAdminStore, AdminMutation, Revoker
from shared.clock import iso_ms, now_ms
from shared.codes import AdminState, Scope
from shared.http1 import web

Reason = Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
Actor = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
Revision = Annotated[int, msgspec.Meta(ge=0)]


class SetStateBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    state: AdminState
    reason: Reason
    actor: Actor | None = None
    expected_revision: Revision | None = None


class RevokeLeasesBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    reason: Reason
    actor: Actor | None = None
    expected_revision: Revision | None = None


@requires(Scope.READ)
async def admin_view(request: web.Request) -> web.Response:
    store = request.app[ADMIN_STORE]
    view = await store.read_async()
    check, overlay = view.check, view.state
    return json_response(
        {
            "as_of": iso_ms(now_ms()),
            "revision": check.revision,
            "chain_verdict": str(check.verdict),
            "chain_reason": None if check.fault is None else str(check.fault),
            "accounts": [
                {
                    "id": account_id,
                    "administrative_state": None if overlay is None else str(overlay.state_of(account_id)),
                }
                for account_id in store.account_ids
            ],
            "overlay": None if overlay is None else {k: str(v) for k, v in overlay.states.items()},
        }
    )


@requires(Scope.READ)
async def audit(request: web.Request) -> web.Response:
    view = await request.app[ADMIN_STORE].read_async()
    check = view.check
    return json_response(
        {
            "as_of": iso_ms(now_ms()),
            "revision": check.revision,
            "chain_verdict": str(check.verdict),
            "chain_reason": None if check.fault is None else str(check.fault),
            "fault_line": check.fault_line,
            "records": list(check.records),
        }
    )


@requires(Scope.ADMIN)
async def set_state(request: web.Request) -> web.Response:
    store = request.app[ADMIN_STORE]
    account_id = request.match_info["account_id"]
    body = await read_json(request, SetStateBody)
    refuse_secret_shapes(reason=body.reason, actor=body.actor)
    done = await store.set_state(
        account_id,
        body.state,
        reason=body.reason,
        actor=body.actor,
        authenticated_by=authenticated_by(request),
        expected_revision=body.expected_revision,
    )
    return json_response(_mutation_payload(done))


@requires(Scope.ADMIN)
async def revoke_leases(request: web.Request) -> web.Response:
    store = request.app[ADMIN_STORE]
    account_id = request.match_info["account_id"]
    body = await read_json(request, RevokeLeasesBody)
    refuse_secret_shapes(reason=body.reason, actor=body.actor)
    revoker: Revoker = request.app[LEASE_REVOKER]  # type: ignore[assignment]
    done = await store.revoke_leases(
        account_id,
        revoker,
        reason=body.reason,
        actor=body.actor,
        authenticated_by=authenticated_by(request),
        expected_revision=body.expected_revision,
    )
    return json_response(_mutation_payload(done))


def _mutation_payload(done: AdminMutation) -> dict[str, Any]:
    record = done.record
    payload: dict[str, Any] = {
        "account_id": record["account_id"],
        "action": record["action"],
        "revision": done.revision,
        "based_on_revision": done.based_on_revision,
        "expected_revision": done.expected_revision,
        "revision_checked": done.expected_revision is not None,
        "record": record,
    }
    if done.expected_revision is None:
        payload["note"] = f"no expected_revision was given: applied at the current revision {done.based_on_revision}"
    if done.revoked is not None:
        payload["revoked"] = done.revoked
        # SPEC §16: live hosts that did not acknowledge within 5 s (always [] in embedded mode)
        payload["unacknowledged_hosts"] = list(done.unacknowledged_hosts or ())
    return payload


def add_routes(app: web.Application, store: AccountAdminStore, revoke_account_leases: Revoker) -> None:
    """Install the store, the control service's account-wide revocation and the four routes."""
    app[ADMIN_STORE] = store
    app[LEASE_REVOKER] = revoke_account_leases
    app.router.add_get("/control/v2/accounts/admin", admin_view)
    app.router.add_get("/control/v2/accounts/audit", audit)
    app.router.add_patch("/control/v2/accounts/{account_id}/state", set_state)
    app.router.add_post("/control/v2/accounts/{account_id}/revoke-leases", revoke_leases)
