"""The v2 side of `make soak`: dispatches through a two-account pool, with fallbacks, renewals,
supersedes, administrative mutations and policy writes running alongside the v1 traffic.

Rule: each lane drives one dispatch at a time and knows, at every moment, whether it holds a
live lease for it. A mint that is *selected* while the lane still holds one is a violation of
"never two live leases for one dispatch" — except a renewal's successor, which the lane
revokes the predecessor of at once. Rows are expected from the answers actually received (an
answer other than a 401 means one ledger row), so the ledger can still be checked exactly.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
from typing import Any

import aiohttp

from tests.support.harness import Gateway

MODEL = "claude-sonnet-4-6"
POOL_ACCOUNT = "anthropic-soak-b"
REPO = "acme/soak"
SCENARIOS = ("plain", "fallback", "renew", "supersede")
HELD_PAUSE_S = 0.25  # shorter than the Retry-After the gateway sends, to keep the soak busy
ROW_OF_STATUS = {200: ("completed", None), 429: ("upstream-error", "rate-limited")}


def accounts_file(stub_url: str) -> str:
    return f'''
[[account]]
id = "{POOL_ACCOUNT}"
provider_binding = "anthropic"
base_url = "{stub_url}"
auth_style = "x-api-key"
credential_env = "GATEWAY_ANTHROPIC_SOAK_B_KEY"
models = ["claude-*"]
lease_capacity = 64
'''


class Control:
    """The control API as the soak's orchestrator and operator use it."""

    def __init__(self, gw: Gateway, session: aiohttp.ClientSession) -> None:
        self.gw = gw
        self.session = session
        self.headers = {"Authorization": f"Bearer {gw.control_token}"}

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
        async with self.session.request(method, self.gw.control_url + path, json=body, headers=self.headers) as r:
            return r.status, await r.json()


class DispatchLane:
    def __init__(self, name: str, gw: Gateway, control: Control, rng: random.Random) -> None:
        self.name = name
        self.gw = gw
        self.control = control
        self.rng = rng
        self.expected: collections.Counter[tuple[str, str | None]] = collections.Counter()
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.violations: list[str] = []
        self.held_key: str | None = None
        self.dispatches = 0

    def _body(self, dispatch: str, **cite: str) -> dict[str, Any]:
        return {
            "dispatch_id": dispatch,
            "repo_slug": REPO,
            "principal_kind": "worker",
            "principal_id": self.name,
            "model": MODEL,
            **cite,
        }

    async def mint(self, dispatch: str, **cite: str) -> dict[str, Any] | None:
        status, body = await self.control.call("POST", "/control/v2/mint", self._body(dispatch, **cite))
        self.outcomes[f"{body.get('outcome')}:{body.get('refusal_reason') or 'ok'}"] += 1
        if status == 503 and not cite:
            await asyncio.sleep(HELD_PAUSE_S)  # a held dispatch waits, as a worker honouring Retry-After would
        if status == 201:
            if self.held_key is not None:
                self.violations.append(f"{dispatch}: selected while {self.held_key} was live ({cite})")
            self.held_key = body["key_id"]
            return body
        return None

    async def revoke(self, key_id: str) -> None:
        await self.control.call("DELETE", f"/control/v1/keys/{key_id}")
        if self.held_key == key_id:
            self.held_key = None

    async def use(self, lease: dict[str, Any], step: dict[str, Any] | None = None) -> int:
        headers = {"x-api-key": lease["token"]}
        if step is not None:
            headers["x-stub-step"] = json.dumps(step)
        body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "soak"}]}
        async with self.control.session.post(self.gw.dataplane_url + "/v1/messages", json=body, headers=headers) as r:
            await r.read()
            if r.status in ROW_OF_STATUS:
                self.expected[ROW_OF_STATUS[r.status]] += 1
            elif r.status != 401:  # 401: the key was refused before any attempt, no row
                self.violations.append(f"unexpected HTTP {r.status} for a v2 lease")
            return r.status

    async def one_dispatch(self) -> None:
        self.dispatches += 1
        dispatch = f"{self.name}-{self.dispatches}"
        first = await self.mint(dispatch)
        if first is None:
            return
        scenario = self.rng.choice(SCENARIOS)
        if scenario == "plain":
            await self.use(first)
            await self.revoke(first["key_id"])
        elif scenario == "fallback":
            await self.use(first, {"status": 429, "headers": {"retry-after": "1"}})
            # citing before revoking must be held: the cited lease is still live
            await self.mint(dispatch, retry_of_mint_decision_id=first["mint_decision_id"])
            await self.revoke(first["key_id"])
            second = await self.mint(dispatch, retry_of_mint_decision_id=first["mint_decision_id"])
            if second is not None:
                await self.use(second)
                await self.revoke(second["key_id"])
        elif scenario == "renew":
            status, successor = await self.control.call("POST", f"/control/v2/keys/{first['key_id']}/renew", {})
            self.outcomes[f"renew:{status}"] += 1
            await self.revoke(first["key_id"])
            if status == 201:
                self.held_key = successor["key_id"]
                await self.use(successor)
                await self.revoke(successor["key_id"])
        else:  # supersede: the response was "lost" before the key was ever used
            await self.revoke(first["key_id"])
            again = await self.mint(dispatch, supersedes_mint_decision_id=first["mint_decision_id"])
            if again is not None:
                await self.use(again)
                await self.revoke(again["key_id"])

    async def run(self, stop_at: float) -> None:
        loop = asyncio.get_running_loop()
        while loop.time() < stop_at:
            await self.one_dispatch()
        if self.held_key is not None:
            await self.revoke(self.held_key)


class Operator:
    """Drains and re-enables the pool's second account, and rewrites the repo's policy."""

    def __init__(self, control: Control) -> None:
        self.control = control
        self.admin_writes = 0
        self.policy_writes = 0
        self.failures: list[str] = []

    async def toggle(self, state: str) -> None:
        _, view = await self.control.call("GET", "/control/v2/accounts/admin")
        status, body = await self.control.call(
            "PATCH",
            f"/control/v2/accounts/{POOL_ACCOUNT}/state",
            {"state": state, "reason": "soak", "actor": "soak", "expected_revision": view["revision"]},
        )
        if status == 200:
            self.admin_writes += 1
        else:
            self.failures.append(f"set-state {state}: {status} {body}")

    async def write_policy(self, order: list[str]) -> None:
        _, view = await self.control.call("GET", "/control/v2/policy")
        status, body = await self.control.call(
            "PUT",
            "/control/v2/policy/level",
            {
                "name": f"repo:{REPO}",
                "expected_revision": view["revision"],
                "document": {"account_order": order},
                "reason": "soak",
            },
        )
        if status == 200:
            self.policy_writes += 1
        else:
            self.failures.append(f"policy write: {status} {body}")

    async def run(self, stop_at: float) -> None:
        loop = asyncio.get_running_loop()
        orders = [["legacy-anthropic", POOL_ACCOUNT], [POOL_ACCOUNT, "legacy-anthropic"]]
        tick = 0
        while loop.time() < stop_at:
            await asyncio.sleep(2.0)
            tick += 1
            await self.toggle("draining" if tick % 2 else "enabled")
            if tick % 3 == 0:
                await self.write_policy(orders[tick % 2])
        await self.toggle("enabled")


async def final_checks(
    control: Control, operator: Operator, lanes: list[DispatchLane], live_v1_keys: int
) -> list[tuple[str, bool, str]]:
    """Invariants of the v2 side, read back from the gateway once the lanes have stopped."""
    _, admin = await control.call("GET", "/control/v2/accounts/admin")
    _, policy = await control.call("GET", "/control/v2/policy")
    _, accounts = await control.call("GET", "/control/v2/accounts")
    leases = sum(a["lease_count"] for a in accounts["accounts"])
    in_flight = sum(a["in_flight_count"] for a in accounts["accounts"])
    violations = [v for lane in lanes for v in lane.violations]
    outcomes = collections.Counter()
    for lane in lanes:
        outcomes.update(lane.outcomes)

    def chain_ok(view: dict[str, Any], writes: int) -> bool:
        verdict = "absent" if writes == 0 else "verified"  # no write yet: no chain file yet
        return view.get("chain_verdict") == verdict and (view.get("revision") or 0) == writes

    return [
        (
            "never two live leases for one dispatch",
            not violations,
            "; ".join(violations[:3]) or f"{sum(lane.dispatches for lane in lanes)} dispatches: {dict(outcomes)}",
        ),
        ("lease counts back to what is held", leases == live_v1_keys, f"{leases} leases, {live_v1_keys} held"),
        ("in-flight counts back to zero", in_flight == 0, f"{in_flight} in flight"),
        (
            "admin chain verified, one record per mutation",
            chain_ok(admin, operator.admin_writes),
            f"{admin.get('chain_verdict')}, revision {admin.get('revision')}, {operator.admin_writes} writes",
        ),
        (
            "policy chain verified, one record per write",
            chain_ok(policy, operator.policy_writes),
            f"{policy.get('chain_verdict')}, revision {policy.get('revision')}, {operator.policy_writes} writes",
        ),
        ("no operator write refused", not operator.failures, "; ".join(operator.failures[:3]) or "none"),
    ]
