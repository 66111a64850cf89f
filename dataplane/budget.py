"""Budgets at the request (SPEC §18). Pure.

Control sets each lease's gate when it pushes it (`Lease.budgeted`: a budget applies somewhere
on the lease's scope chain; `Lease.budget_retry_at_ms`: while one is exhausted, the latest reset
among them) and pushes it again when it changes. A lease with no budget is never looked at past
`lease.budgeted` — the proxy's one attribute test. For a budgeted lease, in this order:

1. a request naming a model the price table does not price is refused 403 `model-unpriced`
   (`x-should-retry: false`): unpriced is never free, and no wait changes it, so it comes first;
2. before `budget_retry_at_ms`, a request is refused 429 `budget-exhausted` with `retry-after`
   (whole seconds until then) and `x-should-retry: false` — an SDK would otherwise retry a 429
   within seconds of a reset hours away. From that instant on the request goes through without
   waiting for control's next push: every exhausted window on the chain has reset by then;
3. fleet mode (SPEC §19): while control cannot refresh the fleet's spend (`budget_stale`), a
   request is refused 503 `fleet-state-unavailable` with `retry-after: 1`: a budget is never
   turned into a per-host one.

Both are gateway-authored refusals (a `refused` row, never evidence) decided before anything goes
upstream; an attempt already in flight is never looked at again, so none is cut. A request that
names no model is not priced here (`GET /v1/models`); what the upstream serves instead of the
model asked for is priced by control from the row (`served_model`), after the fact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from shared.clock import iso_ms
from shared.codes import Refusal
from shared.models import serves_model
from shared.wire import Lease

EXHAUSTED_STATUS = 429  # at the request; the mint holds the same code 503 (`HTTP_STATUS`)


class Hold(NamedTuple):
    code: Refusal
    status: int
    retry_after_s: float | None
    message: str


class PricedModels:
    """Whether the price table prices a model: control's globs (`Snapshot.priced`, matched as
    control matches them), memoized per name. Model names come from workers, so the memo is
    bounded (cleared when full). Without globs (a control older than them) everything passes."""

    MEMO_MAX = 4096

    def __init__(self, globs: Sequence[str] | None = None) -> None:
        self.globs = None if globs is None else tuple(globs)
        self._memo: dict[str, bool] = {}

    def __call__(self, model: str) -> bool:
        if self.globs is None:
            return True
        found = self._memo.get(model)
        if found is None:
            if len(self._memo) >= self.MEMO_MAX:
                self._memo.clear()
            found = self._memo[model] = serves_model(model, self.globs)
        return found


def budget_hold(lease: Lease, model: str | None, now_ms: int, priced: Callable[[str], bool]) -> Hold | None:
    """Why a request on a budgeted `lease` naming `model` is refused now, or None."""
    if model is not None and not priced(model):
        return Hold(
            Refusal.MODEL_UNPRICED,
            403,
            None,
            f"model {model[:128]!r} has no price, and a budget governs this lease's scope: "
            "unpriced spend is refused (add it to GATEWAY_PRICES_FILE)",
        )
    retry_at = lease.budget_retry_at_ms
    if lease.budget_stale and (retry_at is None or now_ms >= retry_at):
        return Hold(
            Refusal.FLEET_STATE_UNAVAILABLE,
            503,
            1,
            "the fleet's spend could not be refreshed lately, and a budget governs this lease's "
            "scope: requests are held until it can be",
        )
    if retry_at is not None and now_ms < retry_at:
        return Hold(
            Refusal.BUDGET_EXHAUSTED,
            EXHAUSTED_STATUS,
            (retry_at - now_ms) / 1000,
            f"a budget of this lease's scope is exhausted until {iso_ms(retry_at)}; see GET /control/v2/budgets",
        )
    return None
