"""The data plane's budget check (SPEC §18) by table: a budgeted lease's request refused 403
`model-unpriced` for a model without a price, 429 `budget-exhausted` until its gate's reset,
and let through from that instant on; globs matched as control prices."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from dataplane.budget import PricedModels, budget_hold
from shared.codes import Refusal
from shared.wire import Lease

NOW = 1_800_000_000_000
GLOBS = ("claude-sonnet-4*", "gpt-5*")


def lease(retry_at_ms: int | None = None, stale: bool = False) -> Lease:
    return Lease(
        key_id="k",
        digest=b"\0" * 32,
        account_id="a",
        expires_at_ms=NOW + 600_000,
        budgeted=True,
        budget_retry_at_ms=retry_at_ms,
        budget_stale=stale,
    )


class Case(NamedTuple):
    name: str
    given: tuple[Lease, str | None]
    expect: tuple[Refusal, int, float | None] | None


CASES = [
    Case("a priced model, nothing exhausted", (lease(), "claude-sonnet-4-6"), None),
    Case("no model named (GET /v1/models)", (lease(), None), None),
    Case("a model without a price", (lease(), "claude-house-1"), (Refusal.MODEL_UNPRICED, 403, None)),
    Case("globs are case-sensitive, as control's", (lease(), "Claude-Sonnet-4-6"), (Refusal.MODEL_UNPRICED, 403, None)),
    Case("exhausted: until the reset", (lease(NOW + 90_500), "gpt-5"), (Refusal.BUDGET_EXHAUSTED, 429, 90.5)),
    Case("exhausted, and nothing named: still refused", (lease(NOW + 1), None), (Refusal.BUDGET_EXHAUSTED, 429, 0.001)),
    Case(
        "unpriced and exhausted: unpriced first (no reset lifts it)",
        (lease(NOW + 5_000), "claude-house-1"),
        (Refusal.MODEL_UNPRICED, 403, None),
    ),
    Case("from the reset on it goes through", (lease(NOW), "gpt-5"), None),
    Case("a reset in the past", (lease(NOW - 1), "gpt-5"), None),
    # SPEC §19: the fleet's spend is stale (control could not refresh it for 5 s)
    Case(
        "stale fleet spend: held 503, retry in a second",
        (lease(stale=True), "gpt-5"),
        (Refusal.FLEET_STATE_UNAVAILABLE, 503, 1),
    ),
    Case("stale and nothing named: held too", (lease(stale=True), None), (Refusal.FLEET_STATE_UNAVAILABLE, 503, 1)),
    Case(
        "stale and exhausted: the reset's wait is the longer",
        (lease(NOW + 5_000, stale=True), "gpt-5"),
        (Refusal.BUDGET_EXHAUSTED, 429, 5.0),
    ),
    Case(
        "stale and unpriced: unpriced first", (lease(stale=True), "claude-house-1"), (Refusal.MODEL_UNPRICED, 403, None)
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_budget_hold(case: Case) -> None:
    held = budget_hold(*case.given, NOW, PricedModels(GLOBS))
    got = None if held is None else (held.code, held.status, held.retry_after_s)
    assert got == case.expect


def test_a_control_without_price_globs_is_not_checked() -> None:
    assert budget_hold(lease(), "claude-house-1", NOW, PricedModels(None)) is None


def test_the_memo_is_bounded() -> None:
    priced = PricedModels(GLOBS)
    for n in range(PricedModels.MEMO_MAX + 10):
        priced(f"m-{n}")
    assert len(priced._memo) <= PricedModels.MEMO_MAX


def test_the_data_plane_matches_prices_as_control_does() -> None:
    from controlplane.core.pricing import price_for
    from controlplane.prices import shipped_prices

    table = shipped_prices()
    priced = PricedModels(sorted({g for p in table.price for g in p.models}))
    for model in ("claude-sonnet-4-6", "claude-opus-4-7", "gpt-5-mini", "claude-house-1", "glm-4.6", "o3", ""):
        assert priced(model) is (price_for(table, model) is not None), model
