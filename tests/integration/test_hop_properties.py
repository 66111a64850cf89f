"""Dispatch keys under random interleavings (SPEC §17): attempts started and finished (with every
kind of ending), revokes, expiries and the hops they trigger, through the real control service
and the data plane's real lease replica (each push applied to it, as the RPC would).

Whatever the sequence: never two live leases for one dispatch, never attempts of one dispatch in
flight on two accounts, never more hops than the budget, and the replica always agrees with
control on which account a key is on.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.core.pricing import PriceTable
from controlplane.mintshapes import MintV2
from controlplane.registry import AccountSpec, Registry
from dataplane.leases import LeaseReplica
from shared.codes import AuthStyle, Binding, EndReason
from shared.evidence import condition_for_terminal
from shared.tokens import new_ulid
from shared.wire import AttemptRow, Lease
from tests.support.control import make_control

ACCOUNTS = ("acc-a", "acc-b", "acc-c")
MAX_HOPS = 2
ENDINGS = {
    "429": ("upstream-error", 429),
    "529": ("upstream-error", 529),
    "500": ("upstream-error", 500),
    "400": ("upstream-error", 400),
    "200": ("completed", 200),
    "abort": ("client-aborted", 200),
    "cut": ("transport-error", 200),
}

step = st.one_of(
    st.tuples(st.just("mint"), st.integers(0, 1)),
    st.tuples(st.just("start"), st.integers(0, 1)),
    st.tuples(st.just("finish"), st.integers(0, 5), st.sampled_from(sorted(ENDINGS))),
    st.tuples(st.just("revoke"), st.integers(0, 1)),
    st.tuples(st.just("expire"), st.integers(0, 1)),
)


def _accounts() -> list[AccountSpec]:
    return [
        AccountSpec(
            id=i,
            display_name=i,
            provider_binding=Binding.ANTHROPIC,
            base_url="http://x",
            auth_style=AuthStyle.X_API_KEY,
            credential_env=f"GATEWAY_{i.upper().replace('-', '_')}_KEY",
            models=("m*",),
            lease_capacity=3,
        )
        for i in ACCOUNTS
    ]


def _row(lease: Lease, attempt_id: str, ending: str | None) -> AttemptRow:
    status, http_status = ENDINGS[ending] if ending else (None, None)
    condition = None if ending is None else condition_for_terminal(status, http_status, None)
    return AttemptRow(
        attempt_id=attempt_id,
        key_id=lease.key_id,
        account_id=lease.account_id,
        mint_decision_id=lease.mint_decision_id,
        dispatch_id=lease.dispatch_id,
        repo_slug=lease.repo_slug,
        principal_id="p",
        wire="anthropic",
        path="/v1/messages",
        requested_model="m1",
        served_model=None,
        stream=False,
        started_at="s",
        finished_at=None if ending is None else "f",
        status=status,
        http_status=http_status,
        condition=None if condition is None else str(condition),
        refusal_reason=None,
        usage=None,
        cost_usd=None,
        cost_reason=None,
        overhead_ms=None,
    )


async def _run(tmp: Path, steps) -> list[str]:
    """Run the steps checking every invariant after each; the accounts hopped to, in order."""
    env = {a.credential_env: "k" for a in _accounts()}
    control = make_control(
        tmp / new_ulid(),
        settings={"GATEWAY_MAX_FALLBACK_HOPS": str(MAX_HOPS)},
        env=env,
        registry=Registry(_accounts()),
        prices=PriceTable(price=()),
        keys_journal=False,
    )
    service, desk = control.service, control.desk
    replica = LeaseReplica(env={})
    replica.load([], [], True)

    async def added(lease: Lease) -> bool:
        replica.add(lease)
        return True

    async def removed(key_ids: list[str]) -> bool:
        for key_id in key_ids:
            replica.remove(key_id)
        return True

    service.link.lease_added = added  # type: ignore[method-assign]  # the RPC, applied at once
    service.link.leases_removed = removed  # type: ignore[method-assign]
    in_flight: list[tuple[Lease, str]] = []  # (the lease the data plane admitted it on, attempt id)

    def live_key(dispatch: int) -> Lease | None:
        return next((lease for lease in service.keys.all() if lease.dispatch_id == f"d{dispatch}"), None)

    for item in steps:
        op = item[0]
        if op == "mint" and live_key(item[1]) is None:
            await desk.mint_v2(
                MintV2(
                    dispatch_id=f"d{item[1]}",
                    repo_slug="r",
                    principal_kind="w",
                    principal_id="p",
                    model="m1",
                    fallback_driver="gateway",
                )
            )
        elif op == "start" and (lease := live_key(item[1])) is not None:
            admitted = replica.lookup_by_key(lease.key_id)
            if admitted is not None and not (admitted.hop_on and replica.is_moving(admitted)):
                attempt_id = "att_" + new_ulid()
                await service.on_message(None, _started(admitted, attempt_id))  # type: ignore[arg-type]
                in_flight.append((admitted, attempt_id))
        elif op == "finish" and in_flight:
            admitted, attempt_id = in_flight.pop(item[1] % len(in_flight))
            row = _row(admitted, attempt_id, item[2])
            replica.hop_pending(admitted, row.condition, row.refusal_reason)  # as Attempt.finish does
            service.record(row)
        elif op in ("revoke", "expire") and (lease := live_key(item[1])) is not None:
            await service.end_keys([lease.key_id], EndReason.REVOKED if op == "revoke" else EndReason.EXPIRED)
        await service.settle()
        for lease in service.keys.all():
            decision = await service.decisions.for_key(lease.key_id)
            assert decision is not None and decision.hop <= MAX_HOPS
            assert replica.lookup_by_key(lease.key_id) == lease  # the replica agrees
        per_dispatch: dict[str | None, int] = {}
        for lease in service.keys.all():
            per_dispatch[lease.dispatch_id] = per_dispatch.get(lease.dispatch_id, 0) + 1
        assert all(n <= 1 for n in per_dispatch.values()), per_dispatch
        accounts_in_flight: dict[str | None, set[str]] = {}
        for admitted, _ in in_flight:
            accounts_in_flight.setdefault(admitted.dispatch_id, set()).add(admitted.account_id)
        assert all(len(a) <= 1 for a in accounts_in_flight.values()), accounts_in_flight
        for account in ACCOUNTS:
            live_here = sum(1 for lease in service.keys.all() if lease.account_id == account)
            assert await service.lease_capacity.count(account) == live_here
    return [e.data.to_account for e in service.events.replay if e.kind == "dispatch.hop"]


def _started(lease: Lease, attempt_id: str):
    from shared.wire import AttemptStarted

    return AttemptStarted(row=_row(lease, attempt_id, None))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(step, min_size=1, max_size=40))
def test_no_interleaving_breaks_a_dispatch_keys_invariants(tmp_path: Path, steps) -> None:
    asyncio.run(_run(tmp_path, steps))


def test_the_interleavings_do_hop_a_fixed_sequence_to_the_budget_and_no_further(tmp_path: Path) -> None:
    """Non-vacuity: a 429, a 529 and a cut, each on the key's current account, hop it twice
    (the budget), then it stays; a 400 and an abort never hop."""
    steps = [
        ("mint", 0),
        ("start", 0),
        ("finish", 0, "400"),
        ("start", 0),
        ("finish", 0, "abort"),
        ("start", 0),
        ("finish", 0, "429"),
        ("start", 0),
        ("finish", 0, "529"),
        ("start", 0),
        ("finish", 0, "cut"),
        ("start", 0),
        ("finish", 0, "200"),
    ]
    assert asyncio.run(_run(tmp_path, steps)) == ["acc-b", "acc-c"]


def test_a_hop_waits_for_the_attempt_in_flight(tmp_path: Path) -> None:
    steps = [("mint", 0), ("start", 0), ("start", 0), ("finish", 0, "429"), ("start", 0)]
    assert asyncio.run(_run(tmp_path, steps)) == []  # one still in flight: pending, nothing admitted
    assert asyncio.run(_run(tmp_path, [*steps, ("finish", 0, "200")])) == ["acc-b"]
