"""`FleetHost`: this control daemon's place in the fleet (SPEC §16) — joining, the repairs its
standing calls for, and the loops that keep this host and the fleet's shared state in step.

At start (`start`, before the RPC socket and the HTTP listener open):
1. claim the host id; a live pair holding it refuses this one (`HostIdTaken`: the daemon exits 2
   naming GATEWAY_HOST_ID, and never serves its data plane);
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

Each heartbeat's standing names its repair (`core/fleet.REPAIRS`): `reaped` — end the leases
whose holders the reaper released meanwhile; `state-lost` — Redis lost its data: step 3 again
(so renew, extend, hops and citations of the live leases answer as before the loss; only their
decisions' evidence is gone), then re-read the chains (a chain Redis lost is re-seeded from
this host's mirror);
`superseded` — another instance holds the id: fail closed (the fence shuts, so every mint is
held `fleet-state-unavailable`, and every lease of this host is ended).

Loops (`start`, ended by `stop`): heartbeat + reaper (`Membership.run`); this host's in-flight
counts (`InFlightBoard`, each beat); the chain poll (`CHAIN_POLL_S`, off the loop, so readers on
the loop get a recently validated chain: `HashChain.read_recent`); the owed writes' delivery;
events out (this host's `account.state`, `circuit`, `policy`) and in (the other hosts', fed
into the local hub without being published again); and the revocation stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

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
from controlplane.events import EventHub, EventKind
from controlplane.fleet.events import RevokeRequest
from controlplane.fleet.hostevents import EVENT_QUEUE_MAX, HostEvents
from controlplane.fleet.owed import DELIVER_INTERVAL_S
from controlplane.fleet.registered import Registrations
from controlplane.fleet.view import RedisFleet
from controlplane.fleet.wiring import SUPERSEDED, UNJOINED, FleetBackends
from controlplane.service import ControlService
from controlplane.stores.admin import AccountAdminStore, Revocation
from controlplane.stores.policy import PolicyStore
from shared.capacity import StateUnavailable
from shared.clock import now_ms
from shared.codes import EndReason, Standing
from shared.fleet.hosts import HostClaim, Reaped
from shared.fleet.keys import Ceiling
from shared.fleet.membership import Membership
from shared.fleet.redis_client import describe, raise_if_cancelled
from shared.logging import get_logger
from shared.settings import Settings
from shared.supervisor import LoopStatus, reported
from shared.tokens import ulid_ms

log = get_logger("fleet")

JOIN_DEADLINE_S = 20.0     # a start waits this long for Redis to answer the claim, then exits 2
JOIN_RETRY_S = 0.5
HOLD_SLACK_MS = 250        # past one beat after a data loss, for a sibling's beat to land
SUBSCRIBE_WAIT_S = 2.0     # a start waits this long for the event subscription, then goes on


def _monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class FleetUnreachable(Exception):
    """Redis did not answer the host claim within `JOIN_DEADLINE_S` (the message names the URL's
    host, never its password)."""


class FleetHost(HostEvents):
    def __init__(self, backends: FleetBackends, *, settings: Settings, service: ControlService,
                 admin: AccountAdminStore, policy: PolicyStore, events: EventHub) -> None:
        self.b = backends
        self.settings = settings
        self.host_id = settings.host_id
        self.service = service
        self.admin = admin
        self.policy = policy
        self.hub = events
        self.membership = Membership(backends.hosts, settings.host_id, recover=self._recover,
                                     on_reaped=self._on_reaped, on_superseded=self._on_superseded)
        self.membership.fence = backends.fence   # the one the lease table's scripts are fenced by
        self._tasks: list[asyncio.Task[Any]] = []
        self._outbox: asyncio.Queue[tuple[EventKind, Any]] = asyncio.Queue(EVENT_QUEUE_MAX)
        self._relaying = False                   # set while a received event is fed to the hub
        self._live_seen: frozenset[str] = frozenset()       # the live hosts at the last look
        # after a data loss: (earliest, latest admission, hosts live before it), monotonic ms
        self._hold: tuple[int, int, frozenset[str]] | None = None
        self._incarnation = ""                   # the data's incarnation this host registered into
        self.registrations = Registrations(backends.client, backends.keys, backends.entries)
        events.listen(self._on_local_event)

    # ---- what the read plane asks (`controlplane/fleet/view.Standings`) ----------------------

    @property
    def standing(self) -> Standing | None:
        return self.membership.standing

    @property
    def registered(self) -> bool:
        return (self.b.fence.value not in (UNJOINED, SUPERSEDED, None) and not self.membership.recovering
                and self.b.lease_capacity.admitting and self.b.supervisor.healthy())

    def writes_owed(self) -> int:
        return len(self.b.owed)

    def loops(self) -> tuple[LoopStatus, ...]:   # this control's, then its data plane's (SPEC §19)
        return self.b.supervisor.statuses() + reported(self.service.routes.dataplane_loops, "dataplane:")

    def view(self) -> RedisFleet:
        """The read plane's fleet (`controlplane/fleet/view.py`)."""
        service = self.service
        return RedisFleet(host_id=self.host_id, fleet_id=self.settings.fleet_id,
                          account_ids=[a.id for a in service.registry.accounts], hosts=self.b.hosts,
                          capacity=self.b.lease_capacity, board=self.b.board, me=self,
                          leases=service.keys.count_by_account, in_flight=service.routes.in_flight_by_account)

    # ---- start and stop ----------------------------------------------------------------------

    async def start(self) -> None:
        self.b.lease_decisions.load(self.service.keys.all())   # the restored leases' decisions
        claim = await self._join()
        self._live_seen = frozenset(await self.b.hosts.live_hosts())
        after = await self.b.revocations.last_id()   # served from here on: nothing between is missed
        await self._end_missed_revocations()
        await self._reregister(claim.incarnation, after_loss=False)
        self.membership.registered(claim)
        log.info("fleet_host_registered", host_id=self.host_id, fleet_id=self.settings.fleet_id,
                 epoch=claim.epoch, leases=len(self.service.keys.all()))
        subscribed = asyncio.Event()
        self.b.lease_capacity.healthy = self.b.supervisor.healthy   # a failing loop holds the mints
        revocations = self.b.revocations
        loops: dict[str, Callable[[], Coroutine[Any, Any, Any]]] = {
            "heartbeat": self.membership.run, "in-flight": self._flight_loop, "chain-poll": self._chain_poll,
            "owed-writes": self._owed_loop, "events-out": self._publisher,
            "events-in": lambda: self.b.events.run(self._on_fleet_event, ready=subscribed),
            # a restart resumes after the last request handled, never handles one twice
            "revocations": lambda: revocations.serve(self._on_revoke_request, after=revocations.position or after)}
        for name, make in loops.items():
            self._tasks.append(self.b.supervisor.spawn(name, make))
        try:  # the other hosts' events reach this host's feed from the moment it serves
            await asyncio.wait_for(subscribed.wait(), SUBSCRIBE_WAIT_S)
        except TimeoutError:
            log.warning("fleet_events_not_subscribed", host_id=self.host_id, waited_s=SUBSCRIBE_WAIT_S)

    async def stop(self) -> None:
        """A clean stop: the loops end, owed writes get one last try, the host id is let go."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            await asyncio.wait_for(self.b.owed.deliver(), 2.0)
        except Exception:  # Redis away at shutdown: a restart's re-registration lets go of them
            pass
        await self.membership.leave()
        await self.b.close()
        log.info("fleet_host_left", host_id=self.host_id, writes_owed=len(self.b.owed))

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(coroutine))

    async def _join(self) -> HostClaim:
        deadline = time.monotonic() + JOIN_DEADLINE_S
        while True:
            try:
                return await self.membership.join()
            except StateUnavailable as exc:
                if time.monotonic() > deadline:
                    raise FleetUnreachable(f"the fleet's Redis at {describe(self.settings.fleet_redis_url or '')} "
                                           f"did not answer for {JOIN_DEADLINE_S:g}s: {exc}") from exc
                log.warning("fleet_join_retrying", host_id=self.host_id, error=str(exc))
                await asyncio.sleep(JOIN_RETRY_S)

    # ---- the repairs -----------------------------------------------------------------------

    async def _end_missed_revocations(self) -> None:
        restored = [RestoredLease(key_id=lease.key_id, account_id=lease.account_id,
                                  minted_at_ms=ulid_ms(lease.key_id)) for lease in self.service.keys.all()]
        if not restored:
            return
        requests = await self.b.revocations.requests_since(min(r.minted_at_ms for r in restored))
        ended = missed_revocations(restored, [MissedRevocation(account_id=r.account_id, at_ms=r.at_ms)
                                              for r in requests])
        if ended:
            log.warning("fleet_missed_revocations_applied", host_id=self.host_id, leases=len(ended))
            await self.service.end_keys(ended, EndReason.ACCOUNT_REVOKED)

    async def _reregister(self, incarnation: str, *, after_loss: bool) -> None:
        """Take back the holders of this host's live leases, oldest first, the ceiling honoured
        (and their dispatches, one live lease each); end the refused ones; let go of whatever else
        this host id held; put their decisions back; say so in the fleet's `registered` set.
        After a data loss, hold new holders until the hosts live before it registered too
        (`core/fleet.may_admit`)."""
        await self._reregister_dispatches()
        leases = {lease.key_id: lease for lease in self.service.keys.all()}
        order = reregistration_order(leases)
        holders = [(leases[k].account_id, k, self._ceiling(leases[k].account_id)) for k in order]
        refused = set(await self.b.lease_capacity.reregister(holders, incarnation=incarnation))
        if refused:
            log.warning("fleet_reregistration_refused", host_id=self.host_id, leases=len(refused))
            await self.service.end_keys(sorted(refused), END_REASONS[Repair.REREGISTER])
        released = await self.b.lease_capacity.retain_only([k for k in order if k not in refused])
        await self._reregister_decisions()
        self._incarnation = incarnation
        await self.registrations.add(incarnation, self.host_id)   # MAC'd (SPEC §19): it lifts a hold
        if after_loss:
            now, beat_ms = _monotonic_ms(), int(self.membership.interval_s * 1000)
            self._hold = (now + beat_ms + HOLD_SLACK_MS, now + self.b.hosts.ttl_ms + beat_ms,
                          self._live_seen - {self.host_id})
            self.b.lease_capacity.admitting = False
        log.info("fleet_holders_registered", host_id=self.host_id, kept=len(order) - len(refused),
                 refused=len(refused), let_go=len(released), awaiting=sorted(self._live_seen - {self.host_id})
                 if after_loss else [])

    async def _reregister_dispatches(self) -> None:
        """Each live v2 lease back in its dispatch's live set, unless another host holds a live
        lease of that dispatch now (minted while this host's entries were lost, or while it was
        declared dead): then this host's keys of it end, as a refused holder's (401, re-mint)."""
        refused = await self.b.decisions.reregister_live(live_groups(self.service.keys.all()), self.host_id)
        if refused:
            log.warning("fleet_dispatch_reregistration_refused", host_id=self.host_id, leases=len(refused))
            await self.service.end_keys(refused, END_REASONS[Repair.REREGISTER])

    async def _reregister_decisions(self) -> None:
        """The decisions of the live leases back into Redis, from this host's own record. One it
        lacks (a journal from before the record existed, a failed write) is taken from Redis
        while Redis still has it; otherwise it is logged, and that lease keeps serving but is
        renewed, extended or hopped only once its worker re-mints (`decision-unknown`)."""
        leases = self.service.keys.all()
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

    async def _check_hold(self) -> None:
        if self._hold is None:
            return
        earliest, latest, seen = self._hold
        if _monotonic_ms() < earliest:
            return
        expected = (seen | frozenset(await self.b.hosts.live_hosts())) - {self.host_id}
        registered = await self.registrations.hosts(self._incarnation)
        if may_admit(_monotonic_ms(), earliest, latest, expected, registered):
            self._hold = None
            self.b.lease_capacity.admitting = True
            log.info("fleet_admitting", host_id=self.host_id, registered=sorted(registered & expected),
                     silent=sorted(expected - registered))

    def _ceiling(self, account_id: str) -> int | None:
        account = self.service.registry.get(account_id)
        return None if account is None else account.lease_capacity

    async def _recover(self, standing: Standing, claim: HostClaim) -> None:
        repair = repair_for(standing)
        if repair is Repair.END_RELEASED:
            await self._end_released()
        elif repair is Repair.REREGISTER:
            await self._reregister(claim.incarnation, after_loss=True)
            await self._refresh_chains()  # a chain Redis lost is re-seeded from this host's mirror

    async def _end_released(self) -> None:
        """Declared dead meanwhile: the leases whose holders were released end (401, re-mint)."""
        leases = [lease.key_id for lease in self.service.keys.all()]
        held = await self.b.lease_capacity.holders_of_host(self.host_id)
        gone = [key_id for key_id in leases if key_id not in held]
        if gone:
            log.warning("fleet_reaped_leases_ended", host_id=self.host_id, leases=len(gone))
            await self.service.end_keys(gone, END_REASONS[Repair.END_RELEASED])

    async def _on_reaped(self, released: list[Reaped]) -> None:
        """This host reaped a dead one: its lease holders' dispatch claims and probes go too."""
        now = now_ms()
        for holder in released:
            if holder.table is Ceiling.LEASE:
                await self.b.decisions.end_key(holder.holder)
                await self.service.circuits.on_lease_ended(holder.account_id, holder.holder, now)

    def _on_superseded(self) -> None:
        self.b.fence.value = SUPERSEDED
        log.error("fleet_failed_closed", host_id=self.host_id,
                  reason="another instance holds this GATEWAY_HOST_ID; mints are held and leases ended")
        self._spawn(self._fail_closed())

    async def _fail_closed(self) -> None:
        leases = [lease.key_id for lease in self.service.keys.all()]
        if leases:
            await self.service.end_keys(leases, END_REASONS[Repair.FAIL_CLOSED])

    # ---- account-wide revocation -------------------------------------------------------------

    async def revoke_account(self, account_id: str) -> Revocation:
        """`revoke-leases` (SPEC §16): every live host ends the account's leases; answers once
        each acknowledged, naming those that did not within the bound."""
        live = set(await self.b.hosts.live_hosts()) | {self.host_id}
        answer = await self.b.revocations.request(account_id, sorted(live))
        if answer.missing:
            log.warning("fleet_revocation_unacknowledged", account_id=account_id, hosts=list(answer.missing))
        return Revocation(revoked=answer.revoked, unacknowledged_hosts=answer.missing)

    async def _on_revoke_request(self, request: RevokeRequest) -> int:
        return await self.service.end_account_keys(request.account_id)

    # ---- the loops (events out and in, the chains' poll: `HostEvents`) -------------------------

    async def _flight_loop(self) -> None:
        """Each beat: this host's in-flight counts out, the live hosts in (who a data loss waits for)."""
        while True:
            raise_if_cancelled()
            try:
                await self.b.board.write(self.host_id, self.service.routes.in_flight_by_account())
                if self._hold is None:
                    self._live_seen = frozenset(await self.b.hosts.live_hosts())
            except StateUnavailable:
                pass
            await asyncio.sleep(self.membership.interval_s)

    async def _owed_loop(self) -> None:
        while True:
            raise_if_cancelled()
            delivered = 0
            try:
                if len(self.b.owed):
                    delivered = await self.b.owed.deliver()   # a bounded batch: the hold's check gets its turn
                await self._check_hold()
            except StateUnavailable:
                pass
            # more owed and Redis took the last batch: the next at once (releases wait behind the queue)
            await asyncio.sleep(0 if delivered and len(self.b.owed) else DELIVER_INTERVAL_S)
