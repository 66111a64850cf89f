"""Randomised property over control's real stores: no sequence of mint, retry, supersede,
evidence, revoke and expiry calls yields two live leases for one dispatch, and each account's
lease capacity counts exactly its live leases. (The capacity table alone:
`tests/unit/test_capacity_table.py`.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.core.pricing import PriceTable
from controlplane.mintshapes import MintV2
from controlplane.registry import AccountSpec, Registry
from controlplane.wiring import Control
from shared.codes import AuthStyle, Binding, EndReason
from shared.tokens import new_ulid
from shared.wire import AttemptRow
from tests.support.control import make_control


def _control(tmp: Path) -> Control:
    accounts = [
        AccountSpec(
            id=i,
            display_name=i,
            provider_binding=Binding.ANTHROPIC,
            base_url="http://x",
            auth_style=AuthStyle.X_API_KEY,
            credential_env=f"GATEWAY_{i.upper()}_KEY",
            models=("m*",),
            lease_capacity=2,
        )
        for i in ("acc-a", "acc-b", "acc-c")
    ]
    env = {a.credential_env: "k" for a in accounts}
    # a fresh state directory per example: hypothesis runs many in one tmp_path
    return make_control(
        tmp / new_ulid(),
        settings={"GATEWAY_MAX_FALLBACK_HOPS": "2"},
        env=env,
        registry=Registry(accounts),
        prices=PriceTable(price=()),
        keys_journal=False,
    )


step = st.one_of(
    st.tuples(st.just("mint"), st.integers(0, 2)),
    st.tuples(st.just("retry"), st.integers(0, 30)),
    st.tuples(st.just("supersede"), st.integers(0, 30)),
    st.tuples(st.just("fail"), st.integers(0, 30), st.sampled_from([429, 500, 402, 400, 200])),
    st.tuples(st.just("revoke"), st.integers(0, 30)),
    st.tuples(st.just("expire"), st.integers(0, 30)),
    st.tuples(st.just("renew"), st.integers(0, 30)),
)


def _row(lease, decision_id: str, n: int, status: int) -> AttemptRow:
    from shared.evidence import condition_for_terminal

    kind = "completed" if status == 200 else "upstream-error"
    condition = condition_for_terminal(kind, status, None)
    return AttemptRow(
        attempt_id=f"att-{n}",
        key_id=lease.key_id,
        account_id=lease.account_id,
        mint_decision_id=decision_id,
        dispatch_id=lease.dispatch_id,
        repo_slug=lease.repo_slug,
        principal_id="p",
        wire="anthropic",
        path="/v1/messages",
        requested_model="m1",
        served_model=None,
        stream=False,
        started_at="x",
        finished_at="y",
        status=kind,
        http_status=status,
        condition=None if condition is None else str(condition),
        refusal_reason=None,
        usage=None,
        cost_usd=None,
        cost_reason=None,
        overhead_ms=None,
    )


async def _run(tmp: Path, steps) -> None:
    control = _control(tmp)
    service, desk = control.service, control.desk
    decisions: list[tuple[str, int]] = []  # (mint decision id, dispatch)
    renewals: set[str] = set()  # successors minted by renew, whose predecessor may still be live

    def body(dispatch: int, **cite) -> MintV2:
        return MintV2(
            dispatch_id=f"d{dispatch}", repo_slug="r", principal_kind="w", principal_id="p", model="m1", **cite
        )

    for n, item in enumerate(steps):
        op = item[0]
        if op == "mint":
            answer = await desk.mint_v2(body(item[1]))
            decisions.append((answer.body["mint_decision_id"], item[1]))
        elif op in ("retry", "supersede") and decisions:
            cited, dispatch = decisions[item[1] % len(decisions)]
            key = "retry_of_mint_decision_id" if op == "retry" else "supersedes_mint_decision_id"
            answer = await desk.mint_v2(body(dispatch, **{key: cited}))
            decisions.append((answer.body["mint_decision_id"], dispatch))
        elif op in ("fail", "revoke", "expire", "renew"):
            live = service.keys.all()
            if not live:
                continue
            lease = live[item[1] % len(live)]
            if op == "fail":
                service.record(_row(lease, lease.mint_decision_id, n, item[2]))
                await service.settle()
            elif op == "renew":
                answer = await desk.renew(lease.key_id, None)
                if answer.status == 201:
                    renewals.add(answer.body["key_id"])
                    await service.end_keys([lease.key_id], EndReason.RENEWED)  # the caller revokes after
            else:
                await service.end_keys([lease.key_id], EndReason.REVOKED if op == "revoke" else EndReason.EXPIRED)
        per_dispatch: dict[str, int] = {}
        for lease in service.keys.all():
            per_dispatch[lease.dispatch_id] = per_dispatch.get(lease.dispatch_id, 0) + 1
        assert all(count <= 1 for count in per_dispatch.values()), per_dispatch
        for account in service.registry.accounts:
            live_here = sum(1 for lease in service.keys.all() if lease.account_id == account.id)
            assert await service.lease_capacity.count(account.id) == live_here
            assert live_here <= (account.lease_capacity or 10**9)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(step, min_size=1, max_size=40))
def test_no_sequence_yields_two_live_leases_for_one_dispatch(tmp_path: Path, steps) -> None:
    asyncio.run(_run(tmp_path, steps))
