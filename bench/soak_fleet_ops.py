"""The fleet soak's orchestrator and operator (mixed into `bench/soak_fleet.FleetSoak`).

The keeper, every `KEEPER_PACE_S`, on a usable host: keeps about `POOL_TARGET` leases (v2 mints
for `acme/capped` or `acme/open`, a third with the shortest TTL, half of those `to_expire`),
renews one (the successor replaces it in the pool, the predecessor is then revoked), or retires
the oldest (out of use, its requests finished, revoked; its token kept for requests that must
answer 401). A lease comes out of use `EXPIRY_MARGIN_S` before it expires and is left to expire
by itself; a `to_expire` one is never retired or renewed before (runs under a minute see none:
60 s is the shortest TTL, SPEC §2).

The operator, every `OPERATOR_PACE_S`, on a usable host: `team-b` draining (a third of the
time) or enabled (`PATCH .../state`), and `repo:acme/capped` rewritten (`PUT /control/v2/policy/level`), each
with the revision just read (409 on a race). Everything that adds a lease to a host's key table
holds `grow` (the sampler's lock, `bench/soak_fleet_faults.py`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tests.support.fleetpairs import MODEL
from tests.support.waits import until

if TYPE_CHECKING:
    from bench.soak_fleet import FleetSoak, Host

CAPPED, OPEN = "team-a", "team-b"
CAPPED_REPO, OPEN_REPO = "acme/capped", "acme/open"
UNCAPPED_REPO = "acme/uncapped"  # policy: team-b only (what a host kill streams on)
POOL_TARGET = 6
POOL_MIN = 3
SHORT_TTL_S, LONG_TTL_S = 60, 600
EXPIRY_MARGIN_S = 5.0  # a lease leaves use this long before it expires: no request races its expiry
KEEPER_PACE_S, OPERATOR_PACE_S = 0.25, 1.5


@dataclass(eq=False)
class Lease:
    key_id: str
    token: str
    account_id: str
    host: int  # the index of the host that minted it (only its data plane serves it)
    ttl_s: int
    minted_at: float  # monotonic
    expires_at: float  # monotonic, as this process estimates it
    last_live: float  # monotonic: when an answer last showed the lease live
    to_expire: bool = False  # left to expire: the keeper never retires nor renews it
    renewable: bool = True  # False once a renewal found no decision for it
    in_use: int = 0  # requests on it in flight
    retired: bool = False  # out of use: revoked, ended or left to expire


def unavailable_reason(host: Host) -> str:
    """The host's own reason for its last `fleet-state-unavailable` (its control log's `error`
    field, which names a loop, a chain or Redis, never a value): what a failure report needs."""
    try:
        lines = (host.gw.workdir / "control.log").read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"{host.name}: its log unreadable ({type(exc).__name__})"
    said = [line for line in lines if "fleet_state_unavailable" in line]
    return f"{host.name}: {said[-1][-240:]}" if said else f"{host.name}: nothing logged"


class FleetOps:
    """Mints, renewals, revokes, expiries and the operator's writes; `self` is the `FleetSoak`."""

    def held(
        self: FleetSoak, what: str, status: int, payload: Any, headers: dict[str, str], host: Host | None = None
    ) -> None:
        """A control answer other than success: counted, and judged against the fault windows."""
        reason = (payload or {}).get("refusal_reason") or ((payload or {}).get("error") or {}).get("code")
        self.tally[what][f"{status} {reason}"] += 1
        if status == 503 and "retry-after" not in headers:
            self.surprise(f"{what}: 503 {reason} without retry-after")
        if reason == "fleet-state-unavailable" and not self.in_redis_fault():
            why = unavailable_reason(host) if host is not None else "host not named"
            self.surprise(f"{what}: held fleet-state-unavailable outside every Redis fault ({why})")
        elif status not in (409, 503):
            self.surprise(f"{what}: HTTP {status} {payload}")

    # ---- leases ---------------------------------------------------------------------------

    async def mint(self: FleetSoak, host: Host, repo: str | None = None) -> Lease | None:
        self.n += 1
        draw = self.rng.random()
        ttl = SHORT_TTL_S if draw < 1 / 3 else LONG_TTL_S
        body = {
            "dispatch_id": f"fs-{self.n}",
            "repo_slug": repo or self.rng.choice((CAPPED_REPO, OPEN_REPO)),
            "principal_kind": "worker",
            "principal_id": "soak",
            "model": MODEL,
            "ttl_seconds": ttl,
        }
        async with self.grow:
            status, payload, headers = await self.api(host, "POST", "/control/v2/mint", body)
            if status != 201:
                self.held("mints", status, payload, headers, host)
                return None
            lease = self.lease_of(payload, host, ttl)
        lease.to_expire = draw < 1 / 6
        self.tally["mints"][f"201 {lease.account_id}"] += 1
        return lease

    def lease_of(self: FleetSoak, payload: dict[str, Any], host: Host, ttl_s: int) -> Lease:
        now = self.now()
        lease = Lease(
            key_id=payload["key_id"],
            token=payload["token"],
            account_id=payload["account_id"],
            host=host.index,
            ttl_s=ttl_s,
            minted_at=now,
            expires_at=now + ttl_s,
            last_live=now,
        )
        self.pool.append(lease)
        self.minted_ids.add(lease.key_id)
        return lease

    async def renew(self: FleetSoak, lease: Lease) -> None:
        """A successor on the same account, then the predecessor revoked. In between, the account
        may hold one lease over its ceiling (the gateway admits the successor on the slot the
        predecessor is about to return): `renewals_started` / `renewals_done` tell the sampler."""
        host = self.hosts[lease.host]
        self.renewals_started += 1
        try:
            async with self.grow:
                status, payload, headers = await self.api(
                    host, "POST", f"/control/v2/keys/{lease.key_id}/renew", {"ttl_seconds": lease.ttl_s}
                )
                successor = self.lease_of(payload, host, lease.ttl_s) if status == 201 else None
            if successor is not None:
                self.tally["renewals"][f"201 {successor.account_id}"] += 1
                await self.retire(lease)
            elif status == 404:
                await self.renewal_unknown(lease)
            else:
                self.held("renewals", status, payload, headers, host)
        finally:
            self.renewals_done += 1

    async def renewal_unknown(self: FleetSoak, lease: Lease) -> None:
        """A renewal answered 404 (no live lease with this key id): one request on the lease says
        whether it is gone (401: a fault ended it, judged as any 401) or live."""
        await self.request(self.hosts[lease.host], lease.token, "json", lease)
        if lease.retired:
            self.tally["renewals"]["404, the lease was gone"] += 1
        elif self.lost_since(lease.minted_at):
            lease.renewable = False
            self.tally["renewals"]["404 on a live lease minted before a Redis data loss"] += 1
            host = self.hosts[lease.host].name
            self.gaps["renewal-after-data-loss"].append(f"{self.at()} s: {lease.key_id} on {host}")
        else:
            self.surprise(f"renewal of the live {lease.key_id} answered 404")

    async def retire(self: FleetSoak, lease: Lease) -> None:
        """Take `lease` out of use, let its requests finish, revoke it."""
        if lease in self.pool:
            self.pool.remove(lease)
        lease.retired = True
        await until(lambda: lease.in_use == 0, 60, f"requests on {lease.key_id} to finish", interval_s=0.01)
        status, payload, _ = await self.api(self.hosts[lease.host], "DELETE", f"/control/v1/keys/{lease.key_id}")
        if status == 200 and payload.get("revoked") is True:
            self.tally["revokes"]["revoked"] += 1
            self.revoked.append((lease.host, lease.token))
        elif status == 200:
            self.lease_ended(lease, "revoke found nothing")
        else:
            self.tally["revokes"][f"{status} (retried later)"] += 1
            self.revoke_later.append(lease)

    def let_expire(self: FleetSoak) -> None:
        now = self.now()
        for lease in [x for x in self.pool if x.expires_at - now < EXPIRY_MARGIN_S]:
            self.pool.remove(lease)
            lease.retired = True
            self.expiring.append(lease)
            self.tally["expiries"]["left to expire"] += 1

    async def keeper(self: FleetSoak) -> None:
        while self.now() < self.stop_at:
            await asyncio.sleep(KEEPER_PACE_S)
            self.let_expire()
            hosts = [h for h in self.hosts if h.usable]
            if not hosts:
                continue
            if self.revoke_later and self.hosts[self.revoke_later[0].host].usable:
                await self.retire(self.revoke_later.pop(0))
            mine = [lease for lease in self.pool if self.hosts[lease.host].usable and not lease.to_expire]
            op = self.rng.random()
            if len(self.pool) < POOL_MIN or not mine or (op < 0.4 and len(self.pool) < 2 * POOL_TARGET):
                await self.mint(self.rng.choice(hosts))
            elif op < 0.7:
                await self.retire(mine[0])
            elif op < 0.85 and (renewable := [x for x in mine if x.renewable]):
                await self.renew(self.rng.choice(renewable))

    # ---- the operator ---------------------------------------------------------------------

    async def operator(self: FleetSoak) -> None:
        tick = 0
        while self.now() < self.stop_at:
            await asyncio.sleep(OPERATOR_PACE_S)
            hosts = [h for h in self.hosts if h.usable]
            if not hosts:
                continue
            tick += 1
            host = self.rng.choice(hosts)
            if tick % 2:  # draining for one tick in three of these
                await self.set_state(host, "draining" if tick % 6 == 1 else "enabled")
            else:
                await self.write_policy(host, with_hop=tick % 4 == 0)

    async def set_state(self: FleetSoak, host: Host, state: str) -> bool:
        status, view, _ = await self.api(host, "GET", "/control/v2/accounts/admin")
        if status != 200:
            return False
        status, payload, headers = await self.api(
            host,
            "PATCH",
            f"/control/v2/accounts/{OPEN}/state",
            {"state": state, "reason": "soak", "actor": "soak", "expected_revision": view["revision"]},
        )
        self.write_done("admin writes", status, payload, headers, host)
        return status == 200

    async def write_policy(
        self: FleetSoak, host: Host, *, with_hop: bool, repo: str = CAPPED_REPO, account: str = CAPPED
    ) -> bool:
        status, view, _ = await self.api(host, "GET", "/control/v2/policy")
        if status != 200:
            return False
        document: dict[str, Any] = {"account_order": [account]}
        if with_hop:
            document["max_fallback_hops"] = 0
        status, payload, headers = await self.api(
            host,
            "PUT",
            "/control/v2/policy/level",
            {"name": f"repo:{repo}", "expected_revision": view["revision"], "document": document, "reason": "soak"},
        )
        self.write_done("policy writes", status, payload, headers, host)
        return status == 200

    def write_done(
        self: FleetSoak, what: str, status: int, payload: Any, headers: dict[str, str], host: Host | None = None
    ) -> None:
        if status == 200:
            self.tally[what]["200"] += 1
        elif status == 409 and self.tally[what]["503 fleet-state-unavailable"]:
            self.tally[what]["409 (an earlier held write had landed)"] += 1
        else:
            self.held(what, status, payload, headers, host)
