"""`GET /control/v2/policy/explain` and `POST /control/v2/mint` agree on every row of a table of
states: each chain absent, verified or corrupt; a candidate disabled, draining, open or full; a
citation live, released, unknown, mismatched or budget-spent; a budget of the chain exhausted, a
model without a price in a budgeted chain (SPEC §18); a candidate's provider headroom below
the policy's floor, or its reset passed (SPEC §22).

In-process over a real socket (the real control app, its real chain files). Each case arranges
the state, asks explain, then mints with the same identity and intent, and compares what explain
said would happen with what did.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from controlplane.core.pricing import Price, PriceTable
from controlplane.main import build_app
from controlplane.registry import AccountSpec, Registry
from controlplane.wiring import Control
from shared.clock import iso_ms, now_ms
from shared.codes import HTTP_STATUS, AdminState, AuthStyle, Binding, Refusal
from shared.tokens import new_ulid
from shared.wire import AttemptRow, RateLimit, RateLimits, Usage
from tests.support.control import TOKEN, close_control, make_control

A, B = "acct-a", "acct-b"
MODEL = "m-1"
ACCOUNTS = [
    AccountSpec(
        id=i,
        display_name=i,
        provider_binding=Binding.ANTHROPIC,
        base_url="http://x",
        auth_style=AuthStyle.X_API_KEY,
        credential_env=f"GATEWAY_{i.upper().replace('-', '_')}_KEY",
        models=("m-*",),
        lease_capacity=1,
    )
    for i in (A, B)
]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PRICES = PriceTable(price=(Price(models=("m-1",), input=1.0, output=1.0, cache_read=1.0, cache_creation=1.0),))


class World:
    def __init__(self, control: Control, client: Any) -> None:
        self.control = control
        self.client = client

    async def mint(self, dispatch: str, **cite: str) -> tuple[int, dict]:
        body = {
            "dispatch_id": dispatch,
            "repo_slug": "acme/app",
            "principal_kind": "worker",
            "principal_id": "p",
            "model": MODEL,
            **cite,
        }
        response = await self.client.post("/control/v2/mint", json=body, headers=AUTH)
        return response.status, await response.json()

    async def explain(self, dispatch: str, **cite: str) -> dict:
        query = {"repo_slug": "acme/app", "model": MODEL, "dispatch_id": dispatch, **cite}
        response = await self.client.get("/control/v2/policy/explain", params=query, headers=AUTH)
        assert response.status == 200, await response.text()
        return (await response.json())["would_select"]

    async def admin(self, account_id: str, state: AdminState) -> None:
        await self.control.admin.set_state(account_id, state, reason="test", actor=None, authenticated_by="admin")

    async def policy(self, document: dict) -> None:
        revision = self.control.policy.read().check.revision
        await self.control.policy.put_level(
            "platform", document, expected_revision=revision, reason="test", actor=None, authenticated_by="admin"
        )

    def corrupt(self, name: str) -> None:
        path = Path(self.control.settings.state_dir) / name
        path.write_text('{"not": "a chain record"}\n')

    async def fail(self, minted: dict, status: int = 429) -> None:
        """A terminal row of the minted lease, as the data plane reports it."""
        condition = {429: "rate-limited", 500: "upstream-unavailable", 200: None}[status]
        row = AttemptRow(
            attempt_id="att_" + new_ulid(),
            key_id=minted["key_id"],
            account_id=minted["account_id"],
            mint_decision_id=minted["mint_decision_id"],
            dispatch_id=None,
            repo_slug="acme/app",
            principal_id="p",
            wire="anthropic",
            path="/v1/messages",
            requested_model=MODEL,
            served_model=None,
            stream=False,
            started_at="s",
            finished_at="f",
            status="completed" if status == 200 else "upstream-error",
            http_status=status,
            condition=condition,
            refusal_reason=None,
            usage=None,
            cost_usd=None,
            cost_reason=None,
            overhead_ms=None,
        )
        self.control.service.record(row)
        await self.control.service.settle()

    async def spend(self, minted: dict, tokens: int) -> None:
        """A completed, priced row of the minted lease, finished now: `tokens` millionths of a dollar."""
        row = AttemptRow(
            attempt_id="att_" + new_ulid(),
            key_id=minted["key_id"],
            account_id=minted["account_id"],
            mint_decision_id=minted["mint_decision_id"],
            dispatch_id=None,
            repo_slug="acme/app",
            principal_id="p",
            wire="anthropic",
            path="/v1/messages",
            requested_model=MODEL,
            served_model=MODEL,
            stream=False,
            started_at=iso_ms(now_ms()),
            finished_at=iso_ms(now_ms()),
            status="completed",
            http_status=200,
            condition=None,
            refusal_reason=None,
            usage=Usage(output_tokens=tokens),
            cost_usd=None,
            cost_reason=None,
            overhead_ms=None,
        )
        self.control.service.record(row)
        await self.control.service.settle()

    def headroom(self, account_id: str, remaining: int, reset_in_ms: int) -> None:
        """A row of `account_id` whose answer stated `remaining` of 1,000 tokens (SPEC §22)."""
        now = now_ms()
        stated = RateLimits(
            observed_at=iso_ms(now - 1),
            tokens=RateLimit(limit=1000, remaining=remaining, reset_at=iso_ms(now + reset_in_ms)),
        )
        row = AttemptRow(
            attempt_id="att_" + new_ulid(),
            key_id="k",
            account_id=account_id,
            mint_decision_id=None,
            dispatch_id=None,
            repo_slug="acme/app",
            principal_id="p",
            wire="anthropic",
            path="/v1/messages",
            requested_model=MODEL,
            served_model=MODEL,
            stream=False,
            started_at=iso_ms(now),
            finished_at=iso_ms(now),
            status="completed",
            http_status=200,
            condition=None,
            refusal_reason=None,
            usage=None,
            cost_usd=None,
            cost_reason=None,
            overhead_ms=None,
            rate_limits=stated,
        )
        self.control.service.record(row)

    async def revoke(self, minted: dict) -> None:
        assert await self.control.service.revoke(minted["key_id"])

    async def open_circuit(self, account_id: str) -> None:
        for _ in range(3):
            status, minted = await self.mint("opener-" + new_ulid())
            assert status == 201 and minted["account_id"] == account_id, minted
            await self.fail(minted, 500)
            await self.revoke(minted)


Arrange = Callable[[World], Awaitable[dict[str, str]]]  # → the citation to ask with


async def nothing(world: World) -> dict[str, str]:
    return {}


async def admin_verified(world: World) -> dict[str, str]:
    await world.admin(A, AdminState.ENABLED)
    return {}


async def admin_corrupt(world: World) -> dict[str, str]:
    world.corrupt("account-admin.jsonl")
    return {}


async def policy_verified(world: World) -> dict[str, str]:
    await world.policy({"account_order": [B, A]})
    return {}


async def policy_corrupt(world: World) -> dict[str, str]:
    world.corrupt("policy.jsonl")
    return {}


async def both_corrupt(world: World) -> dict[str, str]:
    world.corrupt("account-admin.jsonl")
    world.corrupt("policy.jsonl")
    return {}


async def a_disabled(world: World) -> dict[str, str]:
    await world.admin(A, AdminState.DISABLED)
    return {}


async def a_draining(world: World) -> dict[str, str]:
    await world.admin(A, AdminState.DRAINING)
    return {}


async def both_disabled(world: World) -> dict[str, str]:
    await world.admin(A, AdminState.DISABLED)
    await world.admin(B, AdminState.DISABLED)
    return {}


async def a_open(world: World) -> dict[str, str]:
    await world.open_circuit(A)
    return {}


async def a_full(world: World) -> dict[str, str]:
    status, _ = await world.mint("other-dispatch")  # acct-a's one lease slot
    assert status == 201
    return {}


async def citation_live(world: World) -> dict[str, str]:
    _, minted = await world.mint("d1")
    await world.fail(minted)
    return {"retry_of_mint_decision_id": minted["mint_decision_id"]}


async def citation_released(world: World) -> dict[str, str]:
    _, minted = await world.mint("d1")
    await world.fail(minted)
    await world.revoke(minted)
    return {"retry_of_mint_decision_id": minted["mint_decision_id"]}


async def citation_without_evidence(world: World) -> dict[str, str]:
    _, minted = await world.mint("d1")
    await world.fail(minted, 200)
    await world.revoke(minted)
    return {"retry_of_mint_decision_id": minted["mint_decision_id"]}


async def supersede_released(world: World) -> dict[str, str]:
    _, minted = await world.mint("d1")
    await world.revoke(minted)
    return {"supersedes_mint_decision_id": minted["mint_decision_id"]}


async def citation_unknown(world: World) -> dict[str, str]:
    return {"retry_of_mint_decision_id": "md_" + new_ulid()}


async def citation_mismatched(world: World) -> dict[str, str]:
    _, minted = await world.mint("another-dispatch")
    await world.fail(minted)
    await world.revoke(minted)
    return {"retry_of_mint_decision_id": minted["mint_decision_id"]}


async def citation_budget_spent(world: World) -> dict[str, str]:
    _, first = await world.mint("d1")
    await world.fail(first)
    await world.revoke(first)
    status, hop = await world.mint("d1", retry_of_mint_decision_id=first["mint_decision_id"])
    assert status == 201 and hop["hop"] == 1, hop
    await world.fail(hop)
    await world.revoke(hop)
    return {"retry_of_mint_decision_id": hop["mint_decision_id"]}


async def citation_held(world: World) -> dict[str, str]:
    await world.admin(A, AdminState.DISABLED)
    await world.admin(B, AdminState.DISABLED)
    _, held = await world.mint("d1")
    await world.admin(A, AdminState.ENABLED)
    await world.admin(B, AdminState.ENABLED)
    return {"retry_of_mint_decision_id": held["mint_decision_id"]}


async def budget_exhausted(world: World) -> dict[str, str]:
    await world.policy({"budgets": [{"window": "day", "usd": 0.00001}]})
    _, minted = await world.mint("spender")
    await world.spend(minted, 20)  # $0.00002
    await world.revoke(minted)
    return {}


async def budget_not_reached(world: World) -> dict[str, str]:
    await world.policy({"budgets": [{"window": "day", "usd": 1}]})
    _, minted = await world.mint("spender")
    await world.spend(minted, 20)
    await world.revoke(minted)
    return {}


async def model_unpriced_in_budgeted_chain(world: World) -> dict[str, str]:
    await world.policy({"budgets": [{"window": "month", "usd": 100}]})
    return {"model": "m-2"}  # served by both accounts (m-*), priced by nothing


async def model_unpriced_without_budget(world: World) -> dict[str, str]:
    return {"model": "m-2"}


async def a_low(world: World) -> dict[str, str]:
    await world.policy({"min_headroom_percent": 10})
    world.headroom(A, 50, 60_000)  # 5 %
    return {}


async def both_low(world: World) -> dict[str, str]:
    await world.policy({"min_headroom_percent": 10})
    world.headroom(A, 50, 60_000)
    world.headroom(B, 0, 60_000)
    return {}


async def a_low_floor_off(world: World) -> dict[str, str]:
    world.headroom(A, 0, 60_000)
    return {}


async def a_low_reset_passed(world: World) -> dict[str, str]:
    await world.policy({"min_headroom_percent": 10})
    world.headroom(A, 0, -1)
    return {}


class Case(NamedTuple):
    name: str
    arrange: Arrange
    outcome: str
    refusal: str | None
    account: str | None


CASES = [
    Case("no chain at all", nothing, "selected", None, A),
    Case("admin chain verified", admin_verified, "selected", None, A),
    Case("admin chain corrupt", admin_corrupt, "held", "account-state-unavailable", None),
    Case("policy chain verified", policy_verified, "selected", None, B),
    Case("policy chain corrupt", policy_corrupt, "held", "policy-unavailable", None),
    Case("both chains corrupt", both_corrupt, "held", "account-state-unavailable", None),
    Case("first candidate disabled", a_disabled, "selected", None, B),
    Case("first candidate draining", a_draining, "selected", None, B),
    Case("every candidate disabled", both_disabled, "held", "no-eligible-account", None),
    Case("first candidate's circuit open", a_open, "selected", None, B),
    Case("first candidate full", a_full, "selected", None, B),
    Case("citation whose lease is live", citation_live, "held", "fallback-lease-still-held", None),
    Case("citation released with evidence", citation_released, "selected", None, B),
    Case("citation released without evidence", citation_without_evidence, "held", "fallback-not-authorised", None),
    Case("supersede of a lost response", supersede_released, "selected", None, A),
    Case("citation unknown", citation_unknown, "held", "fallback-lineage-unknown", None),
    Case("citation of another dispatch", citation_mismatched, "rejected", "fallback-lineage-mismatch", None),
    Case("citation with the budget spent", citation_budget_spent, "held", "fallback-budget-exhausted", None),
    Case("citation of a held decision", citation_held, "rejected", "fallback-cited-decision-not-selected", None),
    Case("a budget of the chain exhausted", budget_exhausted, "held", "budget-exhausted", None),
    Case("a budget of the chain not reached", budget_not_reached, "selected", None, A),
    Case(
        "a model without a price in a budgeted chain",
        model_unpriced_in_budgeted_chain,
        "rejected",
        "model-unpriced",
        None,
    ),
    Case("a model without a price, no budget anywhere", model_unpriced_without_budget, "selected", None, A),
    Case("first candidate's headroom below the floor", a_low, "selected", None, B),
    Case("every candidate's headroom below the floor", both_low, "held", "no-eligible-account", None),
    Case("headroom low but no floor set", a_low_floor_off, "selected", None, A),
    Case("headroom low but its reset passed", a_low_reset_passed, "selected", None, A),
]


@pytest.fixture
async def world(tmp_path: Path, app_client) -> Any:
    env = {a.credential_env: "k" for a in ACCOUNTS}
    control = make_control(
        tmp_path / "state",
        env=env,
        registry=Registry(ACCOUNTS),
        prices=PRICES,
        settings={"GATEWAY_CIRCUIT_COOLDOWN_SECONDS": "900"},
    )
    await control.service.restore()
    client = await app_client(build_app(control))
    yield World(control, client)
    close_control(control)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_explain_says_what_the_mint_then_does(world: World, case: Case) -> None:
    cite = await case.arrange(world)
    would = await world.explain("d1", **cite)
    status, minted = await world.mint("d1", **cite)
    did = (minted["outcome"], minted.get("refusal_reason"), minted.get("account_id"))
    assert (would["outcome"], would["refusal_reason"], would["account_id"]) == did
    assert did == (case.outcome, case.refusal, case.account)
    assert status == (201 if case.refusal is None else HTTP_STATUS[Refusal(case.refusal)])
    if case.outcome == "selected":
        assert (would["fallback_position"], would["hop"]) == (minted["fallback_position"], minted["hop"])
