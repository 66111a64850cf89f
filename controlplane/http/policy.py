"""Routing policy routes (SPEC §10): read with scope `read`, write with scope `admin`.

- `GET /control/v2/policy`: every level's current document, the tenancy, the revision, the
  chain verdict and the platform ceilings.
- `GET /control/v2/policy/level?name=<level>`: one level's document (null when never written).
- `PUT /control/v2/policy/level` `{name, expected_revision, document, reason, actor?}`: one
  append; 200 with the new revision, 409 naming the current one, 422 naming every problem. A
  `policy` event is published on every write.
- `GET /control/v2/policy/audit[?name=]`: the records, as kept.
- `GET /control/v2/policy/explain?repo_slug=&worker_role=&model=|model_class=`: a dry run of the
  v2 mint for a fresh dispatch — the resolved policy and its provenance, the candidate list with
  every live filter that rules each one out, what a mint would select now, and each budget of the
  chain with its spend (SPEC §18). No lease is taken and no decision is recorded.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from aiohttp import web

from controlplane.core.candidates import build_candidates
from controlplane.core.selection import Candidate, LiveFacts, rule_out, select_account
from controlplane.http.common import authenticated_by, json_response, read_json, refuse_secret_shapes, requires
from controlplane.http.keys import SERVICE
from controlplane.http.mint import DESK
from controlplane.http.spend import budgets_on_chain
from controlplane.overlays import ResolvedPolicy
from controlplane.stores.policy import PolicyStore, Resolution
from shared.clock import iso_ms, now_ms
from shared.codes import AdminState, Outcome, Refusal, Scope, Skip
from shared.errors import GatewayError

POLICY_STORE = web.AppKey("policy_store", PolicyStore)

Reason = Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]
Actor = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=600)]


class PutLevel(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: Name
    expected_revision: Annotated[int, msgspec.Meta(ge=0)]
    document: dict[str, Any]
    reason: Reason
    actor: Actor | None = None


def _chain_fields(view: Any) -> dict[str, Any]:
    check = view.check
    return {"revision": check.revision, "chain_verdict": str(check.verdict),
            "chain_reason": None if check.fault is None else str(check.fault)}


def _ceilings(store: PolicyStore) -> dict[str, Any]:
    return {"fallback_on": sorted(str(c) for c in store.ceiling.fallback_on),
            "max_fallback_hops": store.ceiling.max_fallback_hops}


@requires(Scope.READ)
async def policy_view(request: web.Request) -> web.Response:
    store = request.app[POLICY_STORE]
    view = await store.read_async()
    state = view.state if store.believable(view) else None
    return json_response({
        "as_of": iso_ms(now_ms()), **_chain_fields(view),
        "levels": None if state is None else {label: state.documents[label] for label in sorted(state.documents)},
        "written_at_revision": None if state is None else state.written_at,
        "tenancy": None if state is None else {"repos": state.team_of, "teams": state.org_of},
        "ceilings": _ceilings(store),
    })


@requires(Scope.READ)
async def level_view(request: web.Request) -> web.Response:
    store = request.app[POLICY_STORE]
    name = request.query.get("name", "")
    level, _ = store.validate(name, {})
    view = await store.read_async()
    if not store.believable(view):
        raise GatewayError(Refusal.POLICY_UNAVAILABLE, "the policy chain cannot be believed",
                           extra=_chain_fields(view))
    assert view.state is not None
    return json_response({
        "name": level.label, **_chain_fields(view),
        "document": view.state.documents.get(level.label),
        "written_at_revision": view.state.written_at.get(level.label),
    })


@requires(Scope.ADMIN)
async def put_level(request: web.Request) -> web.Response:
    store = request.app[POLICY_STORE]
    body = await read_json(request, PutLevel)
    refuse_secret_shapes(reason=body.reason, actor=body.actor,
                          document=msgspec.json.encode(body.document).decode())
    written = await store.put_level(body.name, body.document, expected_revision=body.expected_revision,
                                    reason=body.reason, actor=body.actor,
                                    authenticated_by=authenticated_by(request))
    request.app[SERVICE].events.publish("policy", {"name": written.name, "revision": written.revision})
    return json_response({"name": written.name, "revision": written.revision,
                          "based_on_revision": written.based_on_revision,
                          "document": written.document, "record": written.record})


@requires(Scope.READ)
async def audit(request: web.Request) -> web.Response:
    view = await request.app[POLICY_STORE].read_async()
    name = request.query.get("name")
    records = [r for r in view.check.records if name is None or r.get("name") == name]
    return json_response({"as_of": iso_ms(now_ms()), **_chain_fields(view),
                          "fault_line": view.check.fault_line, "records": records})


# ---- explain: the mint's own steps, stopped before anything is reserved -------------------

def live_filters(facts: LiveFacts) -> list[str]:
    """Every live filter that rules an account out now, in SPEC §6 order."""
    ruled = [(not facts.configured, Skip.NOT_CONFIGURED),
             (facts.administrative_state == AdminState.DISABLED, Skip.ADMINISTRATIVE_DISABLED),
             (facts.administrative_state == AdminState.DRAINING, Skip.ADMINISTRATIVE_DRAINING),
             (not facts.circuit_admits, Skip.CIRCUIT_OPEN),
             (not facts.lease_room, Skip.LEASE_CAPACITY_EXHAUSTED)]
    return [str(code) for hit, code in ruled if hit]


def _resolved_view(policy: ResolvedPolicy) -> dict[str, Any]:
    return {"account_order": policy.account_order, "providers": policy.providers,
            "fallback_on": sorted(str(c) for c in policy.fallback_on),
            "max_fallback_hops": policy.max_fallback_hops, "model_classes": policy.model_classes}


def _candidate_view(candidate: Candidate, facts: LiveFacts | None) -> dict[str, Any]:
    code = None if facts is None else rule_out(facts)
    return {"account_id": candidate.account_id, "position": candidate.position,
            "provider_binding": candidate.provider_binding, "effective_model": candidate.effective_model,
            "code": None if code is None else str(code),
            "filters": None if facts is None else live_filters(facts)}


def _would(outcome: Outcome, refusal: Refusal | None = None, **chosen: Any) -> dict[str, Any]:
    return {"outcome": str(outcome), "refusal_reason": None if refusal is None else str(refusal),
            "account_id": chosen.get("account_id"), "fallback_position": chosen.get("fallback_position"),
            "effective_model": chosen.get("effective_model"), "skipped": chosen.get("skipped", [])}


@requires(Scope.READ)
async def explain(request: web.Request) -> web.Response:
    query = request.query
    repo_slug, role = query.get("repo_slug", ""), query.get("worker_role") or None
    model, model_class = query.get("model") or None, query.get("model_class") or None
    if not repo_slug or (model is None) == (model_class is None):
        raise GatewayError(Refusal.INVALID_REQUEST, "give repo_slug and exactly one of model or model_class")
    store, desk = request.app[POLICY_STORE], request.app[DESK]
    view = await store.read_async()
    payload: dict[str, Any] = {"as_of": iso_ms(now_ms()), "repo_slug": repo_slug, "worker_role": role,
                               "model": model, "model_class": model_class, **_chain_fields(view),
                               "policy_revision": view.check.revision, "ceilings": _ceilings(store)}
    resolution: Resolution | None = store.resolution(repo_slug, role, view) if store.believable(view) else None
    payload.update(_resolution_view(resolution))
    payload["budgets"] = None if resolution is None else budgets_on_chain(request.app, resolution.policy.budgets,
                                                                           view.state)
    if resolution is None:
        payload.update(candidates=None, would_select=_would(Outcome.HELD, Refusal.POLICY_UNAVAILABLE))
        return json_response(payload)
    accounts = request.app[SERVICE].registry.accounts
    candidates = build_candidates(accounts, resolution.policy, model, model_class)
    admin_unavailable = desk.admin.is_unavailable()
    live = None if admin_unavailable else desk.live_facts(candidates)
    payload["candidates"] = [_candidate_view(c, None if live is None else live[c.account_id]) for c in candidates]
    payload["would_select"] = _dry_run(candidates, live, admin_unavailable)
    return json_response(payload)


def _resolution_view(resolution: Resolution | None) -> dict[str, Any]:
    if resolution is None:
        return {"tenancy": None, "resolved": None, "provenance": None, "locked_by": None,
                "vetoed": None, "ceilinged": None}
    policy, tenancy = resolution.policy, resolution.tenancy
    return {"tenancy": {"team": tenancy.team, "org": tenancy.org,
                        "levels": [{"name": label, "present": label in resolution.present}
                                   for label in tenancy.labels]},
            "resolved": _resolved_view(policy), "provenance": policy.provenance,
            "locked_by": policy.locked_by, "vetoed": policy.vetoed, "ceilinged": list(policy.ceilinged)}


def _dry_run(candidates: tuple[Candidate, ...], live: dict[str, LiveFacts] | None,
             admin_unavailable: bool) -> dict[str, Any]:
    """The mint's order for a fresh dispatch: admin chain → candidates → selection."""
    if admin_unavailable or live is None:
        return _would(Outcome.HELD, Refusal.ACCOUNT_STATE_UNAVAILABLE)
    if not candidates:
        return _would(Outcome.REJECTED, Refusal.MODEL_NOT_SERVED)
    selection = select_account(candidates, live, 0)
    skipped = [{"account_id": s.account_id, "position": s.position, "code": str(s.code)}
               for s in selection.skipped]
    if selection.chosen is None:
        return _would(Outcome.HELD, selection.refusal or Refusal.NO_ELIGIBLE_ACCOUNT, skipped=skipped)
    chosen = selection.chosen
    return _would(Outcome.SELECTED, account_id=chosen.account_id, fallback_position=chosen.position,
                  effective_model=chosen.effective_model, skipped=skipped)


def add_routes(app: web.Application, store: PolicyStore) -> None:
    app[POLICY_STORE] = store
    app.router.add_get("/control/v2/policy", policy_view)
    app.router.add_get("/control/v2/policy/level", level_view)
    app.router.add_put("/control/v2/policy/level", put_level)
    app.router.add_get("/control/v2/policy/audit", audit)
    app.router.add_get("/control/v2/policy/explain", explain)
