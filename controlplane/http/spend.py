"""Budgets and spend views (SPEC §18, scope `read`).

- `GET /control/v2/budgets`: every budget any policy level sets, against its scope's spend in
  its current UTC window: `level`, `window`, `usd`, `spent_usd`, `remaining_usd`, `exhausted`,
  `window_start`, `resets_at`, `overshoot_usd`, `unpriced_attempts`.
- `GET /control/v2/spend?window=hour|day|month&by=repo|team|org|account|model|principal|binding`
  (defaults `day`, `repo`): rows of `{key, cost_usd, attempts, unpriced_attempts, usage}`, most
  spent first, with `window_start` and `as_of`. `key` null gathers the spend with no team, org,
  role or model. A bad value is a 422 naming the parameter. With `window=hour`, `hours=N`
  (1..168) adds `series`: the last N hours up to this one, oldest first, each `{window_start,
  held, rows}` — what the dashboard charts; `held` is false for an hour before this month began,
  which the book no longer holds (unknown, never drawn as zero).

Both read the spend book in memory (it already holds the month's rotated segments); team and
org follow the tenancy the policy chain holds now, so they need a believable chain (503
`policy-unavailable` otherwise, as the policy views).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from controlplane.core.budgets import all_budgets
from controlplane.core.spend import By
from controlplane.core.spendscopes import TenancyMap
from controlplane.core.windows import Window, iso
from controlplane.http.appkeys import SPEND_BOOK, SPEND_POLICY
from controlplane.http.common import int_query, json_response, requires
from controlplane.spend import SpendBook
from controlplane.stores.policy import PolicyStore
from shared.codes import ErrorCode, Refusal, Scope
from shared.errors import GatewayError
from shared.http1 import web

SERIES_HOURS_MAX = 168


def _choice(request: web.Request, name: str, kind: type[StrEnum], default: StrEnum) -> Any:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        allowed = [str(member) for member in kind]
        raise GatewayError(
            ErrorCode.INVALID_REQUEST,
            f"{name} must be one of {', '.join(allowed)}",
            extra={"param": name, "allowed": allowed},
        ) from None


async def _tenancy(request: web.Request) -> tuple[TenancyMap, Any]:
    store = request.app[SPEND_POLICY]
    view = await store.read_async()
    if not store.believable(view):
        raise GatewayError(
            Refusal.POLICY_UNAVAILABLE,
            "the policy chain cannot be believed",
            extra={"chain_verdict": str(view.check.verdict)},
        )
    state = view.state
    assert state is not None  # a believable view is a folded one
    return TenancyMap(team_of=state.team_of, org_of=state.org_of), view


@requires(Scope.READ)
async def budgets_view(request: web.Request) -> web.Response:
    tenancy, view = await _tenancy(request)
    book = request.app[SPEND_BOOK]
    at = book.clock()
    statuses = book.statuses(all_budgets(view.state.documents), tenancy, at)
    return json_response({"as_of": iso(at), "policy_revision": view.check.revision, "budgets": statuses})


@requires(Scope.READ)
async def spend_view(request: web.Request) -> web.Response:
    window = _choice(request, "window", Window, Window.DAY)
    by = _choice(request, "by", By, By.REPO)
    tenancy = (await _tenancy(request))[0] if by in (By.TEAM, By.ORG) else TenancyMap()
    book = request.app[SPEND_BOOK]
    at = book.clock()
    start_ms, entries = book.spend(window, by, tenancy, at)
    payload: dict[str, Any] = {
        "window": str(window),
        "by": str(by),
        "window_start": iso(start_ms),
        "as_of": iso(at),
        "rows": entries,
    }
    if request.query.get("hours"):
        if window != Window.HOUR:
            raise GatewayError(ErrorCode.INVALID_REQUEST, "hours needs window=hour", extra={"param": "hours"})
        hours = int_query(request, "hours", 24, 1, SERIES_HOURS_MAX)
        payload["series"] = [
            {"window_start": iso(start), "held": held, "rows": rows}
            for start, held, rows in book.hourly(hours, by, tenancy, at)
        ]
    return json_response(payload)


def budgets_on_chain(app: web.State, budgets: Any, state: Any) -> list[Any] | None:
    """Explain's `budgets`: each budget of the resolved chain with its spend now (None without
    a resolution, or in an app without the spend book)."""
    book = app.get(SPEND_BOOK)
    if book is None or state is None:
        return None
    return book.statuses(budgets, TenancyMap(team_of=state.team_of, org_of=state.org_of), book.clock())


def add_routes(app: web.Application, book: SpendBook, policy: PolicyStore) -> None:
    app[SPEND_BOOK] = book
    app[SPEND_POLICY] = policy
    app.cleanup_ctx.append(book.background)
    app.router.add_get("/control/v2/budgets", budgets_view)
    app.router.add_get("/control/v2/spend", spend_view)
