"""A fleet host's joining and the repairs its standing calls for (SPEC §16): `HostRecovery`.

At start (`FleetHost.start`, before the RPC socket and the HTTP listener open):
1. claim the host id (`join`); a live pair holding it refuses this one (`HostIdTaken`: the
   daemon exits 2 naming GATEWAY_HOST_ID, and never serves its data plane);
2. end the restored leases that an account-wide `revoke-leases` made while this host was down
   should have ended (`core/fleet.missed_revocations`, over the revocation stream);
3. re-register the holders of the restored leases, oldest first, the ceiling honoured: a holder
   refused (others filled the account meanwhile) ends through the release seam, its worker gets
   401 and re-mints; let go of anything else this host id held (`retain_only`); and the
   decisions of the restored leases and their dispatches' live sets (`_reregister_dispatches`,
   `_reregister_decisions`: from this host's own journal, `LeaseDecisions`), a dispatch another
   host holds a live lease of now ending this host's keys of it, as a refused holder;
4. only then open the fence (`Membership.registered`): no new holder is admitted before the
   old ones are back. Until then every reserve answers `StateLost` (held).

Each heartbeat's standing names its repair (`core/fleet.REPAIRS`, run by `recover`): `reaped` —
end the leases whose holders the reaper released meanwhile; `state-lost` — Redis lost its data:
step 3 again (so renew, extend, hops and citations of the live leases answer as before the loss;
only their decisions' evidence is gone), then re-read the chains (a chain Redis lost is re-seeded
from this host's mirror); `superseded` — another instance holds the id: fail closed (the fence
shuts, so every mint is held `fleet-state-unavailable`, and every lease of this host is ended).

It reads the live leases and the registry through their ports and ends keys through the release
seam's (`controlplane/ports.py`), never through the service.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from controlplane.core.fleet import (
    END_REASONS,
    MissedRevocation,
    Repair,
    RestoredLease,
    may_admit,
    missed_revocations,
    repair_for,
    reregistration_order,
)
from controlplane.decisions import lease_decisions, live_groups
from controlplane.fleet.incarnationfile import write_known
from controlplane.fleet.registered import Registrations
from controlplane.fleet.wiring import SUPERSEDED
from controlplane.ports import AccountReads, KeyEnder, LeaseReads
from shared.capacity import StateUnavailable
from shared.clock import now_ms
from shared.codes import EndReason, Standing
from shared.fleet.hosts import HostClaim, Reaped
from shared.fleet.keys import Ceiling
from shared.fleet.membership import Membership
from shared.fleet.redis_client import describe
from shared.logging import get_logger
from shared.settings import Settings
from shared.tokens import ulid_ms

if TYPE_CHECKING:
    from controlplane.circuits import CircuitRegistry
    from controlplane.fleet.wiring import FleetBackends

log = get_logger("fleet")

JOIN_DEADLINE_S = 20.0  # a start waits this long for Redis to answer the claim, then exits 2
JOIN_RETRY_S = 0.5
HOLD_SLACK_MS = 250  # past one beat after a data loss, for a sibling's beat to land


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class FleetUnreachable(Exception):
    """Redis did not answer the host claim within `JOIN_DEADLINE_S` (the message names the URL's
    host, never its password)."""


class HostRecovery:
    """This host's membership (join, and the repair each beat's standing names) and, after a data
    loss, the hold on new holders until the hosts live before it registered again."""

    def __init__(
        self,
        backends: FleetBackends,
        *,
        settings: Settings,
        keys: LeaseReads,
        registry: AccountReads,
        seam: KeyEnder,
        circuits: CircuitRegistry,
        refresh_chains: Callable[[], Awaitable[Any]],
        spawn: Callable[[Coroutine[Any, Any, Any]], None],
    ) -> None:
        self.b = backends
        self.settings = settings
        self.host_id = settings.host_id
        self.keys = keys
        self.registry = registry
        self.seam = seam
        self.circuits = circuits
        self.refresh_chains = refresh_chains
        self.spawn = spawn
        self.membership = Membership(
            backends.hosts,
            settings.host_id,
            recover=self.recover,
            on_reaped=self.on_reaped,
            on_superseded=self.on_superseded,
        )
        self.membership.fence = backends.fence  # the one the lease table's scripts are fenced by
        self.live_seen: frozenset[str] = frozenset()  # the live hosts at the last look (`HostHeartbeat`)
        # after a data loss: (earliest, latest admission, hosts live before it), monotonic ms
        self.hold: tuple[int, int, frozenset[str]] | None = None
        self.incarnation = ""  # the data's incarnation this host registered into
        self.registrations = Registrations(backends.client, backends.keys, backends.entries)

    async def join(self) -> HostClaim:
        deadline = time.monotonic() + JOIN_DEADLINE_S
        while True:
            try:
                return await self.membership.join()
            except StateUnavailable as exc:
                if time.monotonic() > deadline:
                    raise FleetUnreachable(
                        f"the fleet's Redis at {describe(self.settings.fleet_redis_url or '')} "
                        f"did not answer for {JOIN_DEADLINE_S:g}s: {exc}"
                    ) from exc
                log.warning("fleet_join_retrying", host_id=self.host_id, error=str(exc))
                await asyncio.sleep(JOIN_RETRY_S)

    # ---- the repairs -----------------------------------------------------------------------

    async def end_missed_revocations(self) -> None:
        restored = [
            RestoredLease(key_id=lease.key_id, account_id=lease.account_id, minted_at_ms=ulid_ms(lease.key_id))
            for lease in self.keys.all()
        ]
        if not restored:
            return
        requests = await self.b.revocations.requests_since(min(r.minted_at_ms for r in restored))
        ended = missed_revocations(
            restored, [MissedRevocation(account_id=r.account_id, at_ms=r.at_ms) for r in requests]
        )
        if ended:
            log.warning("fleet_missed_revocations_applied", host_id=self.host_id, leases=len(ended))
            await self.seam.end_keys(ended, EndReason.ACCOUNT_REVOKED)

    async def reregister(self, incarnation: str, *, after_loss: bool) -> None:
        """Take back the holders of this host's live leases, oldest first, the ceiling honoured
        (and their dispatches, one live lease each); end the refused ones; let go of whatever else
        this host id held; put their decisions back; say so in the fleet's `registered` set.
        After a data loss, hold new holders until the hosts live before it registered too
        (`core/fleet.may_admit`)."""
        await self._reregister_dispatches()
        leases = {lease.key_id: lease for lease in self.keys.all()}
        order = reregistration_order(leases)
        holders = [(leases[k].account_id, k, self._ceiling(leases[k].account_id)) for k in order]
        refused = set(await self.b.lease_capacity.reregister(holders, incarnation=incarnation))
        if refused:
            log.warning("fleet_reregistration_refused", host_id=self.host_id, leases=len(refused))
            await self.seam.end_keys(sorted(refused), END_REASONS[Repair.REREGISTER])
        released = await self.b.lease_capacity.retain_only([k for k in order if k not in refused])
        await self._reregister_decisions()
        self.incarnation = incarnation
        write_known(self.settings.state_dir, incarnation)  # a return after a loss holds (SPEC §16)
        await self.registrations.add(incarnation, self.host_id)  # MAC'd (SPEC §19): it lifts a hold
        if after_loss:
            now, beat_ms = _monotonic_ms(), int(self.membership.interval_s * 1000)
            self.hold = (
                now + beat_ms + HOLD_SLACK_MS,
                now + self.b.hosts.ttl_ms + beat_ms,
                self.live_seen - {self.host_id},
            )
            self.b.lease_capacity.admitting = False
        log.info(
            "fleet_holders_registered",
            host_id=self.host_id,
            kept=len(order) - len(refused),
            refused=len(refused),
            let_go=len(released),
            awaiting=sorted(self.live_seen - {self.host_id}) if after_loss else [],
        )

    async def _reregister_dispatches(self) -> None:
        """Each live v2 lease back in its dispatch's live set, unless another host holds a live
        lease of that dispatch now (minted while this host's entries were lost, or while it was
        declared dead): then this host's keys of it end, as a refused holder's (401, re-mint)."""
        refused = await self.b.decisions.reregister_live(live_groups(self.keys.all()), self.host_id)
        if refused:
            log.warning("fleet_dispatch_reregistration_refused", host_id=self.host_id, leases=len(refused))
            await self.seam.end_keys(refused, END_REASONS[Repair.REREGISTER])

    async def _reregister_decisions(self) -> None:
        """The decisions of the live leases back into Redis, from this host's own record. One it
        lacks (a journal from before the record existed, a failed write) is taken from Redis
        while Redis still has it; otherwise it is logged, and that lease keeps serving but is
        renewed, extended or hopped only once its worker re-mints (`decision-unknown`)."""
        leases = self.keys.all()
        kept, missing = lease_decisions(leases, self.b.lease_decisions.by_id())
        if missing:
            absent = frozenset(missing)
            lacking = [lease for lease in leases if lease.key_id in absent]
            stored = await self.b.decisions.stored([lease.mint_decision_id or "" for lease in lacking])
            found, unknown = lease_decisions(lacking, stored)
            for decision in found.values():
                self.b.lease_decisions.add(decision)
            kept.update(found)
            if unknown:
                log.warning("fleet_lease_decisions_unknown", host_id=self.host_id, leases=len(unknown))
        await self.b.decisions.reregister(list(kept.values()))

    async def check_hold(self) -> None:
        if self.hold is None:
            return
        earliest, latest, seen = self.hold
        if _monotonic_ms() < earliest:
            return
        expected = (seen | frozenset(await self.b.hosts.live_hosts())) - {self.host_id}
        registered = await self.registrations.hosts(self.incarnation)
        if may_admit(_monotonic_ms(), earliest, latest, expected, registered):
            self.hold = None
            self.b.lease_capacity.admitting = True
            log.info(
                "fleet_admitting",
                host_id=self.host_id,
                registered=sorted(registered & expected),
                silent=sorted(expected - registered),
            )

    def _ceiling(self, account_id: str) -> int | None:
        account = self.registry.get(account_id)
        return None if account is None else account.lease_capacity

    async def recover(self, standing: Standing, claim: HostClaim) -> None:
        repair = repair_for(standing)
        if repair is Repair.END_RELEASED:
            await self._end_released()
        elif repair is Repair.REREGISTER:
            await self.reregister(claim.incarnation, after_loss=True)
            await self.refresh_chains()  # a chain Redis lost is re-seeded from this host's mirror

    async def _end_released(self) -> None:
        """Declared dead meanwhile: the leases whose holders were released end (401, re-mint)."""
        leases = [lease.key_id for lease in self.keys.all()]
        held = await self.b.lease_capacity.holders_of_host(self.host_id)
        gone = [key_id for key_id in leases if key_id not in held]
        if gone:
            log.warning("fleet_reaped_leases_ended", host_id=self.host_id, leases=len(gone))
            await self.seam.end_keys(gone, END_REASONS[Repair.END_RELEASED])

    async def on_reaped(self, released: list[Reaped]) -> None:
        """This host reaped a dead one: its lease holders' dispatch claims and probes go too."""
        now = now_ms()
        for holder in released:
            if holder.table is Ceiling.LEASE:
                await self.b.decisions.end_key(holder.holder)
                await self.circuits.on_lease_ended(holder.account_id, holder.holder, now)

    def on_superseded(self) -> None:
        self.b.fence.value = SUPERSEDED
        log.error(
            "fleet_failed_closed",
            host_id=self.host_id,
            reason="another instance holds this GATEWAY_HOST_ID; mints are held and leases ended",
        )
        self.spawn(self._fail_closed())

    async def _fail_closed(self) -> None:
        leases = [lease.key_id for lease in self.keys.all()]
        if leases:
            await self.seam.end_keys(leases, END_REASONS[Repair.FAIL_CLOSED])
