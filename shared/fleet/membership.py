"""`Membership`: this process's place in the fleet, kept by one heartbeat loop (SPEC §16).

One beat: heartbeat, then (live) run the reaper, so a dead host's holders are released within
the TTL plus one beat wherever the live hosts are. A beat that finds the host `reaped` or the
fleet's data `state-lost` claims the id again and hands the new claim to `recover`, the
daemon's own repair (end the leases whose holders were released; re-register the holders of
its live leases and in-flight attempts); only when `recover` returns does the fence
(`Incarnation`) move, so no new holder is admitted before the old ones are back. A failed
`recover` is retried on the next beat. `superseded` stops the loop: another instance holds
the id, and `on_superseded` must fail this process closed.

The beat interval is a third of the TTL (two beats may be lost before a live host is dead).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from shared.capacity import StateUnavailable
from shared.codes import Standing
from shared.fleet.capacity import Incarnation
from shared.fleet.hosts import Beat, HostClaim, HostRegistry, Reaped, new_instance_id
from shared.fleet.redis_client import raise_if_cancelled
from shared.logging import get_logger

log = get_logger("fleet")

Recover = Callable[[Standing, HostClaim], Awaitable[None]]
OnReaped = Callable[[list[Reaped]], Awaitable[None]]


class HostIdTaken(Exception):
    """A live instance holds this host id (SPEC §16: a second live pair is refused)."""


class Membership:
    def __init__(
        self,
        registry: HostRegistry,
        host_id: str,
        *,
        recover: Recover,
        on_reaped: OnReaped | None = None,
        on_superseded: Callable[[], None] | None = None,
        interval_s: float | None = None,
        instance_id: str | None = None,
    ) -> None:
        self.registry = registry
        self.host_id = host_id
        self.instance_id = instance_id or new_instance_id()
        self.fence = Incarnation()
        self.interval_s = interval_s if interval_s is not None else registry.ttl_ms / 3000
        self._recover = recover
        self._on_reaped = on_reaped
        self._on_superseded = on_superseded
        self._claim: HostClaim | None = None
        self._pending: tuple[Standing, HostClaim] | None = None
        self.standing: Standing | None = None

    async def join(self, *, wait: bool = True) -> HostClaim:
        """Claim the host id, waiting out (once) a predecessor's unexpired heartbeat when `wait`;
        raise `HostIdTaken` if a live instance still holds it. The caller re-registers what it
        restored with the claim's incarnation, then calls `registered(claim)`."""
        claim = await self.registry.claim(self.host_id, self.instance_id)
        if not claim.granted and wait:
            log.warning("fleet_host_id_waiting", host_id=self.host_id, wait_ms=claim.retry_after_ms)
            await asyncio.sleep(claim.retry_after_ms / 1000 + self.interval_s)
            claim = await self.registry.claim(self.host_id, self.instance_id)
        if not claim.granted:
            raise HostIdTaken(
                f"host id {self.host_id} is held by a live instance "
                f"(its heartbeat expires in {claim.retry_after_ms} ms)"
            )
        self._claim = claim
        log.info("fleet_joined", host_id=self.host_id, epoch=claim.epoch)
        return claim

    @property
    def recovering(self) -> bool:
        """A re-claim whose `recover` has not completed yet (new holders stay fenced out)."""
        return self._pending is not None

    def registered(self, claim: HostClaim) -> None:
        """The holders are registered in `claim`'s incarnation: admit new ones from now on."""
        self.fence.value = claim.incarnation
        self.standing = Standing.LIVE

    async def beat(self) -> Standing:
        """One heartbeat (and reap, when live, or recovery, when not). Raises `StateUnavailable`."""
        claim = self._claim
        if claim is None:
            raise RuntimeError("join() first")
        beat: Beat = await self.registry.heartbeat(self.host_id, self.instance_id, claim.epoch, claim.incarnation)
        self.standing = beat.standing
        if beat.standing == Standing.LIVE:
            await self._reap()
        elif beat.standing == Standing.SUPERSEDED:
            log.error("fleet_host_superseded", host_id=self.host_id)
            if self._on_superseded is not None:
                self._on_superseded()
            return beat.standing
        else:
            log.warning("fleet_host_recovering", host_id=self.host_id, standing=str(beat.standing))
            self._claim = await self.join(wait=False)
            self._pending = (beat.standing, self._claim)
        if self._pending is not None:
            await self._finish_recovery()
        return beat.standing

    async def _finish_recovery(self) -> None:
        assert self._pending is not None
        standing, claim = self._pending
        await self._recover(standing, claim)
        self._pending = None
        self.registered(claim)
        log.info("fleet_host_recovered", host_id=self.host_id, standing=str(standing), epoch=claim.epoch)

    async def _reap(self) -> None:
        dead, released = await self.registry.reap_dead()
        if dead:
            log.warning("fleet_hosts_reaped", hosts=dead, released=len(released))
        if released and self._on_reaped is not None:
            await self._on_reaped(released)

    async def run(self) -> None:
        """Beat every `interval_s` until cancelled or superseded; a beat that cannot reach Redis
        is logged and retried on the next (the stores hold their callers meanwhile)."""
        while True:
            raise_if_cancelled()
            try:
                standing = await self.beat()
            except StateUnavailable as exc:
                log.warning("fleet_heartbeat_failed", host_id=self.host_id, error=str(exc))
            except Exception as exc:  # a failed recover: retried next beat, never the loop's end
                log.error("fleet_recovery_failed", host_id=self.host_id, error=repr(exc))
            else:
                if standing == Standing.SUPERSEDED:
                    return
            await asyncio.sleep(self.interval_s)

    async def leave(self) -> None:
        """A clean stop: let go of the id so a restart claims it at once."""
        try:
            await self.registry.release(self.host_id, self.instance_id)
        except StateUnavailable as exc:
            log.warning("fleet_leave_failed", host_id=self.host_id, error=str(exc))
