"""Budget enforcement's control side over the real socket (SPEC §18): the real control app and
the real data-plane link and replica, in one loop. Rows the data plane reports exhaust a budget;
control pushes the new gate of every live lease, acknowledged; mints are held with the reset's
`Retry-After`; `budget` events fire once per crossing; a policy write and a window's reset lift
the hold again."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.core.windows import Window, window_at
from controlplane.events import EventKind
from controlplane.main import build_app
from controlplane.stores.ledger import Ledger
from controlplane.wiring import Control
from dataplane.leases import LeaseReplica
from dataplane.rpc_client import ControlLink
from shared.clock import iso_ms, now_ms
from shared.rpc import start_unix_server
from shared.tokens import new_ulid
from shared.wire import AttemptRow, Lease, Usage
from tests.support.control import TOKEN, close_control, make_control
from tests.support.ledgerfiles import FakeClock, ms, stamp_of
from tests.support.waits import until

AUTH = {"Authorization": f"Bearer {TOKEN}"}
MODEL = "claude-sonnet-4-6"  # $3 in, $15 out per million: 1,000 output tokens cost $0.015


class World:
    def __init__(self, control: Control, client: Any, dataplane: ControlLink) -> None:
        self.control, self.client, self.dataplane = control, client, dataplane

    async def put(self, name: str, document: dict) -> None:
        revision = self.control.policy.read().check.revision
        response = await self.client.put(
            "/control/v2/policy/level",
            headers=AUTH,
            json={"name": name, "expected_revision": revision, "document": document, "reason": "test"},
        )
        assert response.status == 200, await response.text()

    async def mint_v1(self, repo: str) -> tuple[int, dict, dict]:
        response = await self.client.post(
            "/control/v1/keys",
            headers=AUTH,
            json={"provider_binding": "anthropic", "principal_kind": "worker", "principal_id": "w", "repo_slug": repo},
        )
        return response.status, dict(response.headers), await response.json()

    async def mint_v2(self, repo: str, model: str = MODEL) -> tuple[int, dict, dict]:
        response = await self.client.post(
            "/control/v2/mint",
            headers=AUTH,
            json={
                "dispatch_id": "d-" + new_ulid(),
                "repo_slug": repo,
                "principal_kind": "worker",
                "principal_id": "w",
                "model": model,
            },
        )
        return response.status, dict(response.headers), await response.json()

    async def spend(self, minted: dict, output_tokens: int, finished_at: str | None = None) -> None:
        """A completed row of the lease, reported by the data plane and acknowledged by control."""
        stamp = finished_at or iso_ms(now_ms())
        row = AttemptRow(
            attempt_id="att_" + new_ulid(),
            key_id=minted["key_id"],
            account_id=minted["account_id"],
            mint_decision_id=None,
            dispatch_id=None,
            repo_slug=minted["repo"],
            principal_id="w",
            wire="anthropic",
            path="/v1/messages",
            requested_model=MODEL,
            served_model=MODEL,
            stream=False,
            started_at=stamp,
            finished_at=stamp,
            status="completed",
            http_status=200,
            condition=None,
            refusal_reason=None,
            usage=Usage(output_tokens=output_tokens),
            cost_usd=None,
            cost_reason=None,
            overhead_ms=0.1,
        )
        assert await asyncio.wait_for(self.dataplane.finished(row, wait=True), 5)

    def held(self, key_id: str) -> Lease | None:
        replica = self.dataplane.replica
        digest = replica._digest_of.get(key_id)
        return None if digest is None else replica._by_digest[digest]

    def budget_events(self) -> list[dict]:
        return [
            {"level": e.data.level, "threshold": e.data.threshold, "window": e.data.window}  # type: ignore[attr-defined]
            for e in self.control.service.events.replay
            if e.kind == EventKind.BUDGET
        ]


async def open_world(tmp_path: Path, app_client: Any, ledger: Ledger | None = None) -> AsyncIterator[World]:
    control = make_control(
        tmp_path / "state",
        settings={"GATEWAY_RUNTIME_DIR": str(tmp_path / "rt")},
        env={"GATEWAY_ANTHROPIC_API_KEY": "x"},
        ledger=ledger,
    )
    await control.service.restore()
    client = await app_client(build_app(control))
    server = await start_unix_server(control.settings.rpc_socket, control.service.link.on_client)
    dataplane = ControlLink(control.settings.rpc_socket, LeaseReplica(env={}))
    task = asyncio.create_task(dataplane.run())
    try:
        await asyncio.wait_for(dataplane.synced.wait(), 5)
        yield World(control, client, dataplane)
    finally:
        dataplane.stop()
        task.cancel()
        server.close()
        close_control(control)


@pytest.fixture
async def world(tmp_path: Path, app_client: Any) -> AsyncIterator[World]:
    async for opened in open_world(tmp_path, app_client):
        yield opened


async def test_an_exhausted_budget_holds_mints_and_is_pushed_to_live_leases(world: World) -> None:
    await world.put("repo:acme/app", {"budgets": [{"window": "day", "usd": 0.02}]})
    status, _, lease = await world.mint_v1("acme/app")
    assert status == 201
    lease["repo"] = "acme/app"
    _, _, other = await world.mint_v1("solo/x")
    status, _, v2 = await world.mint_v2("acme/app")
    assert status == 201 and world.held(v2["key_id"]).budgeted
    assert world.held(lease["key_id"]).budgeted and world.held(lease["key_id"]).budget_retry_at_ms is None
    assert not world.held(other["key_id"]).budgeted  # no budget on its chain: the hot path's one test

    # the price table's globs reached the data plane with the snapshot
    assert world.dataplane.replica.priced(MODEL) and not world.dataplane.replica.priced("claude-house-1")

    await world.spend(lease, 1_100)  # $0.0165: 82 %
    assert world.budget_events() == [{"level": "repo:acme/app", "threshold": 80, "window": "day"}]
    assert world.held(lease["key_id"]).budget_retry_at_ms is None
    await world.spend(lease, 400)  # $0.0225: exhausted
    resets_ms = window_at(Window.DAY, now_ms())[2]
    await until(
        lambda: world.held(lease["key_id"]).budget_retry_at_ms == resets_ms,
        5,
        "the exhausted gate pushed to the data plane",
    )
    assert world.held(other["key_id"]).budget_retry_at_ms is None
    await world.spend(lease, 100)  # in flight when it ran out: the overshoot
    assert [e["threshold"] for e in world.budget_events()] == [80, 100]  # once per crossing

    for status, headers, body in (await world.mint_v1("acme/app"), await world.mint_v2("acme/app")):
        wait_s = math.ceil((resets_ms - now_ms()) / 1000)
        assert status == 503 and abs(int(headers["Retry-After"]) - wait_s) <= 2, (status, headers, body)
        assert (body.get("refusal_reason") or body["error"]["code"]) == "budget-exhausted"
    assert (await world.mint_v1("solo/x"))[0] == 201
    renewed = await world.client.post(f"/control/v2/keys/{v2['key_id']}/renew", headers=AUTH, json={})
    assert (
        renewed.status == 503 and (await renewed.json())["refusal_reason"] == "budget-exhausted"
    )  # a renewal is a mint
    assert world.held(v2["key_id"]).budget_retry_at_ms == resets_ms

    response = await world.client.get(
        "/control/v2/policy/explain", headers=AUTH, params={"repo_slug": "acme/app", "model": MODEL}
    )
    would = (await response.json())["would_select"]
    assert (would["outcome"], would["refusal_reason"]) == ("held", "budget-exhausted") and would["retry_after_s"] > 0
    budgets = (await (await world.client.get("/control/v2/budgets", headers=AUTH)).json())["budgets"]
    assert budgets[0]["exhausted"] and budgets[0]["overshoot_usd"] == pytest.approx(0.0240 - 0.02)
    metrics = await (await world.client.get("/metrics", headers=AUTH)).text()
    assert 'leasehold_budgets{state="exhausted"} 1.0' in metrics
    assert 'leasehold_spend_day_usd{account_id="legacy-anthropic"} 0.024' in metrics

    await world.put("repo:acme/app", {})  # the budget removed: every gate pushed again
    await until(lambda: not world.held(lease["key_id"]).budgeted, 5, "the gate lifted on the data plane")
    assert world.held(lease["key_id"]).budget_retry_at_ms is None
    assert (await world.mint_v1("acme/app"))[0] == 201


async def test_an_unpriced_model_in_a_budgeted_scope_is_refused_at_the_v2_mint(world: World) -> None:
    status, _, _ = await world.mint_v2("acme/app", "claude-house-1")
    assert status == 201  # no budget anywhere: served, counted unpriced
    await world.put("platform", {"budgets": [{"window": "month", "usd": 1000}]})
    status, headers, body = await world.mint_v2("acme/app", "claude-house-1")
    assert (status, body["outcome"], body["refusal_reason"]) == (403, "rejected", "model-unpriced")
    assert headers["x-should-retry"] == "false" and "Retry-After" not in headers
    assert (await world.mint_v2("acme/app"))[0] == 201


async def test_the_hold_lifts_when_the_window_resets(tmp_path: Path, app_client: Any) -> None:
    clock = FakeClock("2028-02-28T23:59:00")
    ledger = Ledger(str(tmp_path / "state" / "ledger.jsonl"), clock=clock)
    (tmp_path / "state").mkdir()
    ledger.open()
    async for world in open_world(tmp_path, app_client, ledger):
        await world.put("platform", {"budgets": [{"window": "day", "usd": 0.01}]})
        _, _, lease = await world.mint_v1("acme/app")
        lease["repo"] = "acme/app"
        await world.spend(lease, 1_000, finished_at=stamp_of(clock.now))
        midnight = ms("2028-02-29T00:00:00")
        await until(lambda: world.held(lease["key_id"]).budget_retry_at_ms == midnight, 5, "the hold pushed")
        clock.set("2028-02-29T00:00:01")
        world.control.budgets.tick()  # what `maintain` does at the hour's end
        await until(lambda: world.held(lease["key_id"]).budget_retry_at_ms is None, 5, "the hold lifted")
        assert world.held(lease["key_id"]).budgeted
        await world.spend(lease, 600, finished_at=stamp_of(clock.now))  # a new day: 90 %, 80 % again
        assert [e["threshold"] for e in world.budget_events()] == [80, 100, 80]
