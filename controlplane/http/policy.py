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

from controlplane.core.mint import MintVerdict, decide_mint
from controlplane.core.policy import ResolvedPolicy
from controlplane.core.selection import Candidate, LiveFacts, live_filters, rule_out
from controlplane.events import EventKind
from controlplane.http.appkeys import DESK, HUB, POLICY_STORE
from controlplane.http.common import authenticated_by, json_response, read_json, refuse_secret_shapes, requires
from controlplane.http.spend import budgets_on_chain
from controlplane.mintshapes import lineage_of, skips_view
from controlplane.stores.policy import PolicyStore, Resolution
from shared.clock import iso_ms, now_ms
from shared.codes import ErrorCode, Refusal, Scope
from shared.errors import GatewayError
from shared.http1 import web

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
    return {
        "revision": check.revision,
        "chain_verdict": str(check.verdict),
        "chain_reason": None if check.fault is None else str(check.fault),
    }


def _ceilings(store: PolicyStore) -> dict[str, Any]:
    return {
        "fallback_on": sorted(str(c) for c in store.ceiling.fallback_on),
        "max_fallback_hops": store.ceiling.max_fallback_hops,
    }


@requires(Scope.READ)
async def policy_view(request: web.Request) -> web.Response:
    store = request.app[POLICY_STORE]
    view = await store.read_async()
    state = view.state if store.believable(view) else None
    return json_response(
        {
            "as_of": iso_ms(now_ms()),
            **_chain_fields(view),
            "levels": None if state is None else {label: state.documents[label] for label in sorted(state.documents)},
            "written_at_revision": None if state is None else state.written_at,
            "tenancy": None if state is None else {"repos": state.team_of, "teams": state.org_of},
            "ceilings": _ceilings(store),
        }
    )


@requires(Scope.READ)
async def level_view(request: web.Request) -> web.Response:
    store = request.app[POLICY_STORE]
    name = request.query.get("name", "")
    level, _ = store.validate(name, {})
    view = await store.read_async()
    if not store.believable(view):
        raise GatewayError(Refusal.POLICY_UNAVAILABLE, "the policy chain cannot be believed", extra=_chain_fields(view))
    assert view.state is not None
    return json_response(
        {
            "name": level.label,
            **_chain_fields(view),
            "document": view.state.documents.get(level.label),
            "written_at_revision": view.state.written_at.get(level.label),
        }
    )


@requires(Scope.ADMIN)
async def put_level(request: web.Request) -> web.Response:
    store = request.app[POLICY_STORE]
    body = await read_json(request, PutLevel)
    refuse_secret_shapes(reason=body.reason, actor=body.actor, document=msgspec.json.encode(body.document).decode())
    written = await store.put_level(
        body.name,
        body.document,
        expected_revision=body.expected_revision,
        reason=body.reason,
        actor=body.actor,
        authenticated_by=authenticated_by(request),
    )
    request.app[HUB].publish(EventKind.POLICY, {"name": written.name, "revision": written.revision})
    return json_response(
        {
            "name": written.name,
            "revision": written.revision,
            "based_on_revision": written.based_on_revision,
            "document": written.document,
            "record": written.record,
        }
    )


@requires(Scope.READ)
async def audit(request: web.Request) -> web.Response:
    view = await request.app[POLICY_STORE].read_async()
    name = request.query.get("name")
    records = [r for r in view.check.records if name is None or r.get("name") == name]
    return json_response(
        {"as_of": iso_ms(now_ms()), **_chain_fields(view), "fault_line": view.check.fault_line, "records": records}
    )


# ---- explain: the mint's own decision, stopped before anything is reserved ----------------


def _resolved_view(policy: ResolvedPolicy) -> dict[str, Any]:
    return {
        "account_order": policy.account_order,
        "providers": policy.providers,
        "fallback_on": sorted(str(c) for c in policy.fallback_on),
        "max_fallback_hops": policy.max_fallback_hops,
        "model_classes": policy.model_classes,
        "min_headroom_percent": policy.min_headroom_percent,
    }


def _candidate_view(candidate: Candidate, facts: LiveFacts | None) -> dict[str, Any]:
    code = None if facts is None else rule_out(facts)
    return {
        "account_id": candidate.account_id,
        "position": candidate.position,
        "provider_binding": candidate.provider_binding,
        "effective_model": candidate.effective_model,
        "code": None if code is None else str(code),
        "filters": None if facts is None else [str(f) for f in live_filters(facts)],
    }


def _would(verdict: MintVerdict) -> dict[str, Any]:
    chosen = verdict.chosen
    return {
        "outcome": str(verdict.outcome),
        "refusal_reason": None if verdict.refusal is None else str(verdict.refusal),
        "account_id": None if chosen is None else chosen.account_id,
        "fallback_position": None if chosen is None else chosen.position,
        "effective_model": None if chosen is None else chosen.effective_model,
        "hop": verdict.hop if chosen is not None else None,
        "retry_after_s": verdict.retry_after_s,  # `budget-exhausted`: until the last window resets
        "skipped": skips_view(verdict.skipped),
    }


@requires(Scope.READ)
async def explain(request: web.Request) -> web.Response:
    """A dry run of `POST /control/v2/mint` for the same identity and intent: the same facts,
    gathered by the same desk, judged by the same `decide_mint`. With `dispatch_id` (and a
    citation) it explains a retry or a supersede of that dispatch; without, a fresh one."""
    query = request.query
    repo_slug, role = query.get("repo_slug", ""), query.get("worker_role") or None
    model, model_class = query.get("model") or None, query.get("model_class") or None
    retry_of = query.get("retry_of_mint_decision_id") or None
    supersedes = query.get("supersedes_mint_decision_id") or None
    if not repo_slug or (model is None) == (model_class is None):
        raise GatewayError(ErrorCode.INVALID_REQUEST, "give repo_slug and exactly one of model or model_class")
    if retry_of and supersedes:
        raise GatewayError(
            ErrorCode.INVALID_REQUEST,
            "retry_of_mint_decision_id and supersedes_mint_decision_id are mutually exclusive",
        )
    store, desk = request.app[POLICY_STORE], request.app[DESK]
    view = await store.read_async()
    payload: dict[str, Any] = {
        "as_of": iso_ms(now_ms()),
        "repo_slug": repo_slug,
        "worker_role": role,
        "model": model,
        "model_class": model_class,
        **_chain_fields(view),
        "policy_revision": view.check.revision,
        "ceilings": _ceilings(store),
    }
    resolution: Resolution | None = store.resolution(repo_slug, role, view) if store.believable(view) else None
    payload.update(_resolution_view(resolution))
    payload["budgets"] = (
        None if resolution is None else budgets_on_chain(request.app, resolution.policy.budgets, view.state)
    )
    lineage = lineage_of(query.get("dispatch_id", ""), repo_slug, model, model_class)
    gathered = await desk.gather(lineage, role, model, model_class, retry_of=retry_of, supersedes=supersedes)
    facts = gathered.facts
    payload["candidates"] = (
        None
        if gathered.policy is None
        else [_candidate_view(c, facts.live.get(c.account_id)) for c in facts.candidates]
    )
    payload["would_select"] = _would(decide_mint(facts))
    return json_response(payload)


def _resolution_view(resolution: Resolution | None) -> dict[str, Any]:
    if resolution is None:
        return {
            "tenancy": None,
            "resolved": None,
            "provenance": None,
            "locked_by": None,
            "vetoed": None,
            "ceilinged": None,
        }
    policy, tenancy = resolution.policy, resolution.tenancy
    return {
        "tenancy": {
            "team": tenancy.team,
            "org": tenancy.org,
            "levels": [{"name": label, "present": label in resolution.present} for label in tenancy.labels],
        },
        "resolved": _resolved_view(policy),
        "provenance": policy.provenance,
        "locked_by": policy.locked_by,
        "vetoed": policy.vetoed,
        "ceilinged": list(policy.ceilinged),
    }


def add_routes(app: web.Application, store: PolicyStore) -> None:
    app[POLICY_STORE] = store
    app.router.add_get("/control/v2/policy", policy_view)
    app.router.add_get("/control/v2/policy/level", level_view)
    app.router.add_put("/control/v2/policy/level", put_level)
    app.router.add_get("/control/v2/policy/audit", audit)
    app.router.add_get("/control/v2/policy/explain", explain)
