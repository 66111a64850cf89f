"""Request admission on a ceilinged account in fleet mode (SPEC §6, §16): the one place fleet
mode touches the hot path.

Design: the data plane asks Redis itself, one atomic script per admission (`RedisCapacity`,
holder = attempt id, tagged with this host), rather than going through control. Through control
an admission would be an RPC round trip plus control's own Redis call, with control's event
loop (rows, mints, the read plane) between the worker and its answer; directly it is one
loopback round trip (~0.1 ms). Accounts without a request ceiling never reach this module: they
pay nothing per request, in fleet mode as embedded.

- **Release** happens after the answer, off the request's path, and rides along with the next
  reserve when one comes within `RELEASE_WINDOW_S` (one script, released before the take): one
  round trip per request instead of two; otherwise the window's releases go in one script when
  it ends. A slot is so held at most that long after its answer. A release that cannot reach
  Redis is kept and retried (`retry_pending`, from the data plane's timer), so a slot is never
  leaked by an outage; releasing twice is harmless (holder-keyed).
- **A restart of this data plane** releases what its previous instance held (`start`): those
  attempts died with it.
- **Redis lost its data** (the fleet's incarnation changed under us): before admitting anything
  new, this data plane re-registers its own in-flight holders into the new incarnation (once
  control has re-established it), so no ceiling is exceeded by the attempts already running.
- **Redis unreachable**: `StateUnavailable`; the proxy refuses 503 `fleet-state-unavailable`,
  never a silent per-host ceiling.
- **This host's place lapsed**: when this host's control has not heartbeated for
  `lapse_ms` (five sixths of the host TTL: half a beat before any host may declare it dead and
  reuse its slots), a control paused, hung or killed while this data plane runs, the proxy
  refuses requests on every ceilinged account (a lease or a request ceiling) 503
  `fleet-state-unavailable` until the heartbeat is fresh again — the fleet may have given this
  host's slots to others, and a ceiling is never exceeded by a host that lost its place.
  Checked every `check_interval_s` (a twelfth of the TTL); accounts without a ceiling keep
  serving. So are they while one of this data plane's fleet loops keeps failing (`hold`,
  `dataplane/fleetloops.py`, SPEC §19).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import redis.asyncio as aredis

from shared.capacity import StateUnavailable
from shared.fleet.capacity import Incarnation, RedisCapacity, SentReserve
from shared.fleet.entries import FleetEntries
from shared.fleet.hosts import HostRegistry
from shared.fleet.keys import Ceiling, FleetKeys
from shared.fleet.redis_client import StateLost, guard
from shared.fleet.scriptline import ScriptLine
from shared.logging import get_logger
from shared.supervisor import Supervisor

log = get_logger("dataplane")

# How long a release waits for a reserve to carry it (the RPC's lazy reports wait as long).
RELEASE_WINDOW_S = 0.002
# A held request reads the heartbeat again when the last read is at least this old (`hold_now`).
RECHECK_S = 0.05


def lapse_ms(ttl_ms: int) -> int:
    """A host's place lapses half a beat (beats are a third of the TTL) before it may be reaped."""
    return ttl_ms * 5 // 6


def has_lapsed(age_ms: int | None, ttl_ms: int) -> bool:
    """Whether a host whose last heartbeat is `age_ms` old (None: it holds none) lost its place."""
    return age_ms is None or age_ms >= lapse_ms(ttl_ms)


def hold_reason(lapsed: bool, failing: Sequence[str]) -> str | None:
    """Why this data plane cannot honour a fleet-wide ceiling now; None when it can."""
    if lapsed:
        return "this gateway host's place in the fleet has lapsed (its control is not heartbeating)"
    if failing:
        return (
            f"this gateway host's fleet loop{'s' if len(failing) > 1 else ''} {', '.join(failing)} "
            f"keep{'' if len(failing) > 1 else 's'} failing, so its fleet state is not current"
        )
    return None


class FleetAdmission:
    def __init__(
        self, client: aredis.Redis, fleet_id: str, host_id: str, ttl_s: float = 10, entries: FleetEntries | None = None
    ) -> None:
        self.client = client
        self.keys = FleetKeys(fleet_id)
        self.ttl_ms = int(ttl_s * 1000)
        self.check_interval_s = ttl_s / 12
        self.hosts = HostRegistry(client, self.keys, ttl_s, tables=(), entries=entries)  # sealed beats only
        self.lapsed = False  # this host's control lost its place: ceilinged accounts refused
        self.checked_at = 0.0  # monotonic time of the last heartbeat read (`check_standing`)
        self.supervisor = Supervisor()  # this data plane's Redis loops (SPEC §19)
        self.incarnation = Incarnation()
        # the hot scripts (reserve, the window's release) on a connection of their own (issue 27)
        self.line = ScriptLine.of(client)
        self.capacity = RedisCapacity(client, self.keys, Ceiling.REQUEST, host_id, self.incarnation, self.line)
        self.held: dict[str, tuple[str, int]] = {}  # attempt id → (account, ceiling), in flight here
        self.pending_release: set[str] = set()  # releases that could not reach Redis yet
        self.owed: list[str] = []  # answered; released by the next reserve or flush
        self._flush: asyncio.TimerHandle | None = None
        self._releases: set[asyncio.Task[None]] = set()
        self.started = False  # `start` done: a previous instance's holders released

    async def start(self) -> None:
        """Forget what a previous instance of this data plane held (before this one holds
        anything: they share the host's tag), and note the incarnation."""
        if self.started:
            return
        assert not self.held
        released = await self.capacity.release_host(self.capacity.host_id)
        if released:
            log.warning("request_holders_released", count=len(released), reason="dataplane-restarted")
        self.incarnation.value = await self._current_incarnation()
        self.started = True

    def hold(self) -> str | None:
        """Why ceilinged accounts are refused here now (`hold_reason`); None: they are served."""
        return hold_reason(self.lapsed, self.supervisor.failing())

    async def hold_now(self) -> str | None:
        """`hold`, after reading the heartbeat again when this host's place lapsed and the last
        read is older than `RECHECK_S`: a lapse read before this host's control first heartbeated
        (both daemons start at once) ends at the first request after that beat, not a standing
        pass later. Only a held request pays the read; `StateUnavailable` keeps the last answer."""
        if self.lapsed and time.monotonic() - self.checked_at >= RECHECK_S:
            try:
                await self.check_standing()
            except StateUnavailable:
                pass
        return self.hold()

    async def reserve(self, account_id: str, holder: str, ceiling: int) -> bool:
        """Take a request slot fleet-wide; `StateUnavailable` when Redis cannot say."""
        if not self.started:
            await self.start()
        return await self.send_reserve(account_id, holder, ceiling).answer()

    def send_reserve(self, account_id: str, holder: str, ceiling: int) -> PendingReserve:
        """`reserve` written to Redis now (after `start`), its answer read later: the proxy
        prepares the upstream request while Redis answers (issue 27). The handle is either
        answered (`PendingReserve.answer`) or abandoned, never dropped."""
        releasing, self.owed = self.owed, []
        sent = self.capacity.send_reserve(account_id, holder, ceiling, releasing)
        return PendingReserve(self, account_id, holder, ceiling, releasing, sent)

    def release_soon(self, holder: str) -> None:
        """Return the slot after the answer, off the request's path: with the next reserve, or
        within `RELEASE_WINDOW_S`."""
        if self.held.pop(holder, None) is None:
            return
        self.owed.append(holder)
        self._flush_soon()

    def _flush_soon(self) -> None:
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(RELEASE_WINDOW_S, self._flush_owed)

    def _flush_owed(self) -> None:
        self._flush = None
        holders, self.owed = self.owed, []
        if holders:
            task = asyncio.get_running_loop().create_task(self._release(*holders))
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)

    async def _release(self, *holders: str) -> None:
        try:
            await self.capacity.release_all(holders)
            self.pending_release.difference_update(holders)
        except StateUnavailable:
            self.pending_release.update(holders)

    async def retry_pending(self) -> None:
        """Releases that failed while Redis was away, retried (the timer's pass)."""
        if self.pending_release:
            await self._release(*self.pending_release)

    async def check_standing(self) -> bool:
        """Read this host's heartbeat age; answers (and keeps in `lapsed`) whether it lapsed.
        `StateUnavailable` leaves the last answer standing."""
        self.checked_at = time.monotonic()
        age = await self.hosts.heartbeat_age_ms(self.capacity.host_id)
        lapsed = has_lapsed(age, self.ttl_ms)
        if lapsed != self.lapsed:
            if lapsed:
                log.warning(
                    "fleet_place_lapsed",
                    host_id=self.capacity.host_id,
                    heartbeat_age_ms=age,
                    action="ceilinged accounts refused until the heartbeat is fresh",
                )
            else:
                log.info("fleet_place_restored", host_id=self.capacity.host_id, heartbeat_age_ms=age)
            self.lapsed = lapsed
        return lapsed

    async def _current_incarnation(self) -> str | None:
        with guard("request capacity incarnation"):
            value = await self.client.get(self.keys.incarnation)
        return None if value is None else value.decode()

    async def _reregister(self) -> None:
        """Redis lost the fleet's data: take our in-flight holders back into the incarnation
        control re-established (none yet: hold, `StateUnavailable`)."""
        current = await self._current_incarnation()
        if current is None:
            raise StateUnavailable("the fleet's state was lost and is not re-established yet")
        holders = [(account, holder, ceiling) for holder, (account, ceiling) in self.held.items()]
        refused = await self.capacity.reregister(holders, incarnation=current)
        self.incarnation.value = current
        log.warning("request_holders_reregistered", count=len(holders), refused=len(refused))

    async def close(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
        self._flush_owed()
        for task in list(self._releases):
            await task
        self.line.close()
        await self.client.aclose()


class PendingReserve:
    """A reserve written to Redis (`FleetAdmission.send_reserve`), its answer still to read."""

    __slots__ = ("fleet", "account_id", "holder", "ceiling", "releasing", "sent", "settled")

    def __init__(
        self,
        fleet: FleetAdmission,
        account_id: str,
        holder: str,
        ceiling: int,
        releasing: list[str],
        sent: SentReserve,
    ) -> None:
        self.fleet = fleet
        self.account_id = account_id
        self.holder = holder
        self.ceiling = ceiling
        self.releasing = releasing  # the owed releases riding along
        self.sent = sent
        self.settled = False  # answered or abandoned: its holder is accounted for

    async def answer(self) -> bool:
        """Whether the slot was taken; `StateUnavailable` when Redis cannot say. Once."""
        assert not self.settled
        self.settled = True
        fleet, holder, releasing = self.fleet, self.holder, self.releasing
        try:
            try:
                taken = await self.sent.taken()
            except StateLost:
                fleet.pending_release.update(releasing)  # fenced: the script released nothing
                releasing = []
                await fleet._reregister()
                taken = await fleet.capacity.reserve(self.account_id, holder, self.ceiling)
        except (StateUnavailable, asyncio.CancelledError):
            # A timeout's outcome is unknown: a hung Redis runs the reserve once it resumes. The
            # request is refused, so the holder is released like a failed release (harmless if
            # it never landed), never leaked; so are the releases it carried. A worker that went
            # away while the reserve was out leaves the same unknown: released alike.
            fleet.pending_release.add(holder)
            fleet.pending_release.update(releasing)
            raise
        if taken:
            fleet.held[holder] = (self.account_id, self.ceiling)
        return taken

    def abandon(self) -> None:
        """The answer will not be read (the request ended before its first byte went upstream:
        a worker gone, a pool timeout, the drain, a failure): its outcome is unknown, so the
        holder (and the releases it carried) is released as an answered one is — with the next
        reserve or within `RELEASE_WINDOW_S`, on the same connection, so after the reserve —,
        harmless if it was not taken, never leaked. Nothing when it was answered."""
        if self.settled:
            return
        self.settled = True
        self.sent.cancel()
        fleet = self.fleet
        fleet.owed.append(self.holder)
        fleet.owed.extend(self.releasing)
        fleet._flush_soon()
