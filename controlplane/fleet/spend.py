"""`FleetSpend`: the fleet's spend counters in Redis (SPEC §18 "Fleet mode", §16).

Rule: each host publishes **its own totals**, never increments. Its ledger is the authority for
what it served; the fold `SpendBook` rebuilds from that ledger is published window by window
into the host's hash (`{f}:spend:host:<host>`, window key → the window's cells), and every
other host reads those hashes into `core.fleetcells.FleetCells`, which views and budgets read. A
republish replaces what was there, so a retry, a restart or a re-seed never counts a row twice,
and no counter can drift (LiteLLM's increment/decrement leaks have nothing to leak here).

- **Out**: every recorded row marks its hour, day and month dirty; a publish (one Lua script,
  one round trip) writes the dirty windows at most every `PUBLISH_MIN_S`, and a version that
  names this process and its publish (`{f}:spend:versions`, host → version).
- **In**: on every other host's publish (the script announces it on `{f}:spend:moved`; pub/sub
  is at-most-once, so also every `PULL_S` whatever was heard), and at most every `PULL_MIN_S`
  whatever the fleet's size, one round trip reads this host's mark and every host's version; a
  host whose version moved is read (the whole hash the first time, then the windows that can
  still move: this hour, the last one, this day, this month). A change re-reads every budget
  (`BudgetGuard.on_fleet_spend`): a budget exhausted on one host is enforced on every host
  within one publish, one pull and one push of gates (bench.fleet publishes the bound).
- **Data loss**: the mark field `_` is written with every publish; a publish of some windows
  into a hash without it refuses (the script answers 0), and a pull that finds it gone, both
  make the next publish whole (the hash deleted and rewritten from the fold). So a Redis that
  came back empty holds every live host's spend again within one pull. A host that is down
  when Redis loses its data is missing from the fleet's spend until it returns (its ledger is
  on its own disk); README "Fleet mode" says so.
- **Redis away**: dirty windows stay dirty; both resume by themselves. The last spend read is
  never turned into a per-host budget (SPEC §19): once no pull succeeded for `STALE_S`, `stale()`
  is true and `BudgetGuard` holds budgeted mints and requests 503 `fleet-state-unavailable`
  (told at each flip: `stale_listeners`); unbudgeted scopes are untouched.

Nothing is believed unless a host of the fleet published it (SPEC §19): each window's value is
`[mac, cells]`, the MAC over the host, the window key and the cells' bytes; a window that does
not verify, does not decode, or holds a negative or non-finite number (or an unknown dimension)
is skipped, logged once and counted (`spend`), and the host's last good value of that window
stays in force, so garbage cannot erase spend. A reply that is not a hash (a key a writer
replaced) is skipped the same way, for that host only.

Nothing secret is published: repo slugs, bindings, account ids, model names, principal ids and
sums. A host's hash lives `SPEND_TTL_S` past its last publish: a month's windows and a margin,
so a host that died mid-month still counts until its month ends.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from typing import Any

import msgspec
import redis
import redis.asyncio as aredis

from controlplane.core.fleetcells import FleetCells, window_of, window_triples
from controlplane.core.spend import CELL_SIZE, DIMS, WindowCells
from controlplane.core.windows import Window, hour_key, key_at
from controlplane.fleet.events import subscribe
from controlplane.spend import SpendBook
from shared.capacity import StateUnavailable
from shared.fleet.entries import EntryKind, FleetEntries, Why, finite_non_negative
from shared.fleet.keys import FleetKeys
from shared.fleet.redis_client import guard, raise_if_cancelled
from shared.logging import get_logger
from shared.supervisor import Supervisor
from shared.wire import AttemptRow

log = get_logger("fleet")

PUBLISH_MIN_S = 0.1  # a host's rows reach Redis at most this late (coalesced)
PULL_S = 1.0  # the other hosts' spend is read at least this often (and when told)
PULL_MIN_S = 0.05  # and at most this often: announcements meanwhile make one pull
RETRY_S = 1.0  # after a failed publish or pull
SPEND_TTL_S = 40 * 86_400  # a month's windows and a margin past the last publish
MARK = b"_"  # present: the hash holds every window its host has
HOUR_MS = 3_600_000
STALE_S = 5.0  # SPEC §19: no refresh of the fleet's spend this long: budgeted scopes held
STALE_CHECK_S = 0.25  # how often the flip is looked for

# KEYS: the host's hash, the versions hash, the channel; ARGV: whole ('1': replace everything), ttl ms, host,
# version, then window key / cells pairs. A partial publish into a hash Redis lost answers 0.
PUBLISH = """
if ARGV[1] == '1' then
  redis.call('DEL', KEYS[1])
elseif redis.call('HEXISTS', KEYS[1], '_') == 0 then
  return 0
end
for i = 5, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('HSET', KEYS[1], '_', '1')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('PUBLISH', KEYS[3], ARGV[3])
return 1
"""

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(list[tuple[str, str | None, list[float]]]).decode
_decode_signed = msgspec.msgpack.Decoder(tuple[str, bytes]).decode  # (mac, the cells' bytes)
_DIM_NAMES = frozenset(str(d) for d in DIMS)

SpendListener = Callable[[bool], None]  # quiet: True at the start


def moving_keys(at_ms: int) -> list[str]:
    """The windows another host's rows can still move now: this hour, the last one (late rows of
    an hour just ended), this day and this month."""
    return [
        key_at(Window.HOUR, at_ms),
        key_at(Window.HOUR, at_ms - HOUR_MS),
        key_at(Window.DAY, at_ms),
        key_at(Window.MONTH, at_ms),
    ]


class FleetSpend:
    def __init__(
        self,
        client: aredis.Redis,
        keys: FleetKeys,
        host_id: str,
        book: SpendBook,
        *,
        entries: FleetEntries,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.client = client
        self.entries = entries
        self.supervisor = supervisor or Supervisor()  # the fleet host's (SPEC §19), or its own
        self.keys = keys
        self.host_id = host_id
        self.book = book
        self.cells = FleetCells(book.fold)
        book.cells = self.cells
        self.listeners: list[SpendListener] = []
        self.stale_listeners: list[Callable[[bool], None]] = []
        self._fresh_at = time.monotonic()  # the last pull that succeeded (a start counts as fresh)
        self._stale = False
        self.publishes = 0
        self.available = True
        self._mine = keys.spend_host(host_id)
        self._instance = secrets.token_hex(6)
        self._dirty: set[str] = set()
        self._whole = True  # the first publish replaces whatever was there
        self._versions: dict[str, bytes] = {}  # host → the version last read
        self._wake = asyncio.Event()  # this host's windows are dirty
        self._told = asyncio.Event()  # another host published
        self._script = client.register_script(PUBLISH)
        self._tasks: list[asyncio.Task[Any]] = []

    # ---- the row path -------------------------------------------------------------------------

    def note(self, row: AttemptRow) -> None:
        """A row listener (after the book folded it): its windows are dirty."""
        hour = hour_key(row.finished_at)
        if hour is not None:
            self._dirty.update((hour, hour[:10], hour[:7]))
            self._wake.set()

    # ---- start and stop -------------------------------------------------------------------------

    async def start(self) -> None:
        """After the host joined, before it serves: the fleet's spend read once (quietly: what
        it finds crossed was announced before) and this host's published whole."""
        try:
            await self.pull(quiet=True)
            await self.publish()
        except StateUnavailable as exc:
            self._failed("start", exc)
        self._tasks = [
            self.supervisor.spawn(name, make)
            for name, make in (
                ("spend-out", self._publisher),
                ("spend-in", self._puller),
                ("spend-told", self._listener),
                ("spend-stale", self._watch_stale),
            )
        ]

    async def stop(self) -> None:
        """The loops end; what is still dirty gets one last publish."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._dirty or self._whole:
            try:
                await asyncio.wait_for(self.publish(), 2.0)
            except (TimeoutError, StateUnavailable):
                pass  # the next start publishes whole

    # ---- out ------------------------------------------------------------------------------------

    async def publish(self) -> None:
        fold = self.book.fold
        month = key_at(Window.MONTH, self.book.clock())
        whole, dirty = self._whole, self._dirty
        self._whole, self._dirty = False, set()
        if whole:
            held = set(fold.windows) | (
                {fold.open_hour, fold.open_hour[:10], fold.open_hour[:7]} if fold.open_hour is not None else set()
            )
            wanted = sorted(key for key in held if key >= month)
        else:
            wanted = sorted(key for key in dirty if key >= month)
        args: list[Any] = [
            "1" if whole else "0",
            SPEND_TTL_S * 1000,
            self.host_id,
            f"{self._instance}:{self.publishes + 1}",
        ]
        for key in wanted:
            cells = _encode(window_triples(fold, key))
            args += [key, _encode((self.entries.mac(EntryKind.SPEND, [self.host_id, key, cells]), cells))]
        try:
            with guard("spend publish"):
                done = await self._script(keys=[self._mine, self.keys.spend_versions, self.keys.spend_moved], args=args)
        except BaseException:
            self._whole, self._dirty = self._whole or whole, self._dirty | dirty
            raise
        if not done:  # Redis lost this host's hash: everything again
            self._whole = True
            self._wake.set()
            log.warning("fleet_spend_republishing", host_id=self.host_id, reason="hash-lost")
            return
        self.publishes += 1

    async def _publisher(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            raise_if_cancelled()
            try:
                await self.publish()
                self._recovered()
            except StateUnavailable as exc:
                self._failed("publish", exc)
                await asyncio.sleep(RETRY_S)
                self._wake.set()
                continue
            await asyncio.sleep(PUBLISH_MIN_S)  # pacing: the rows of the next moment go in one publish

    # ---- in -------------------------------------------------------------------------------------

    async def pull(self, quiet: bool = False) -> bool:
        """Read the hosts whose published spend moved; True when the fleet's spend changed."""
        with guard("spend pull"):  # one exchange each (`BatchingRedis`; issue 27 §4)
            mine, versions = await asyncio.gather(
                self.client.hexists(self._mine, MARK), self.client.hgetall(self.keys.spend_versions)
            )
        if not mine and self.publishes and not self._whole:
            self._whole = True  # Redis lost this host's hash: the publisher writes it whole
            self._wake.set()
            log.warning("fleet_spend_republishing", host_id=self.host_id, reason="hash-lost")
        named = {host.decode("utf-8", "replace"): version for host, version in versions.items()}
        moved = {
            host: version
            for host, version in named.items()
            if host != self.host_id and self._versions.get(host) != version
        }
        if not moved:
            self._fresh_at = time.monotonic()
            return False
        fields = moving_keys(self.book.clock())
        with guard("spend pull"):
            replies = await asyncio.gather(
                *(
                    self.client.hmget(self.keys.spend_host(host), fields)
                    if host in self.cells.hosts
                    else self.client.hgetall(self.keys.spend_host(host))
                    for host in moved
                ),
                return_exceptions=True,
            )
            for reply in replies:  # an error reply is that host's alone; any other failure, the pull's
                if isinstance(reply, BaseException) and not isinstance(reply, redis.ResponseError):
                    raise reply
        changed = False
        for (host, version), reply in zip(moved.items(), replies):
            if isinstance(reply, dict):
                pairs = [(k.decode("utf-8", "replace"), v) for k, v in reply.items() if k != MARK]
            elif isinstance(reply, list):
                pairs = [(key, v) for key, v in zip(fields, reply) if v is not None]
            else:  # an error reply: the key is not a hash (a writer replaced it)
                self.entries.reject(EntryKind.SPEND, self.keys.spend_host(host), Why.DECODE)
                pairs = []
            windows = {key: window for key, raw in pairs if (window := self._window(host, key, raw)) is not None}
            changed = self.cells.replace(host, windows) or changed
            self._versions[host] = version
        self._fresh_at = time.monotonic()
        if changed:
            for listener in self.listeners:
                listener(quiet)
        return changed

    def _window(self, host: str, key: str, raw: object) -> WindowCells | None:
        """One published window, believed only when its host's MAC verifies and every value is
        in range; else None (rejected: logged once, counted) and the last good one stays."""
        where = f"{self.keys.spend_host(host)}#{key}"
        try:
            tag, cells = _decode_signed(raw) if isinstance(raw, bytes) else ("", b"")
        except (msgspec.DecodeError, msgspec.ValidationError):
            tag, cells = "", b""
        if not cells:
            self.entries.reject(EntryKind.SPEND, where, Why.DECODE)
            return None
        if not self.entries.valid(EntryKind.SPEND, [host, key, cells], tag):
            self.entries.reject(EntryKind.SPEND, where, Why.MAC)
            return None
        try:
            triples = _decode(cells)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.entries.reject(EntryKind.SPEND, where, Why.DECODE)
            return None
        if not all(
            dim in _DIM_NAMES and len(cell) == CELL_SIZE and finite_non_negative(cell) for dim, _key, cell in triples
        ):
            self.entries.reject(EntryKind.SPEND, where, Why.RANGE)
            return None
        return window_of(triples)

    # ---- staleness (SPEC §19) ------------------------------------------------------------------

    def stale(self) -> bool:
        """True once no pull succeeded for `STALE_S`: the fleet's spend cannot be relied on."""
        return time.monotonic() - self._fresh_at > STALE_S

    async def _watch_stale(self) -> None:
        while True:
            stale = self.stale()
            if stale != self._stale:
                self._stale = stale
                log.warning(
                    "fleet_spend_stale" if stale else "fleet_spend_fresh", host_id=self.host_id, stale_after_s=STALE_S
                )
                for listener in self.stale_listeners:
                    listener(stale)
            await asyncio.sleep(STALE_CHECK_S)

    async def _puller(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._told.wait(), PULL_S)
            except TimeoutError:
                pass
            self._told.clear()
            raise_if_cancelled()
            try:
                await self.pull()
                self._recovered()
            except StateUnavailable as exc:
                self._failed("pull", exc)
                await asyncio.sleep(RETRY_S)
                continue
            await asyncio.sleep(PULL_MIN_S)  # pacing: a busy fleet's announcements coalesce

    async def _listener(self) -> None:
        """Wake the puller when another host published (resubscribing after an outage)."""
        me = self.host_id.encode()
        while True:
            raise_if_cancelled()
            pubsub = self.client.pubsub()
            try:
                await subscribe(pubsub, self.keys.spend_moved)
                while True:
                    raise_if_cancelled()
                    with guard("spend listen"):
                        message = await pubsub.get_message(timeout=1.0)
                    if message is not None and message.get("type") == "message" and message["data"] != me:
                        self._told.set()
            except StateUnavailable:
                pass  # the puller's polls go on meanwhile, and report the outage
            finally:
                try:
                    await pubsub.aclose()
                except Exception:
                    pass
            await asyncio.sleep(RETRY_S)

    # ---- health -----------------------------------------------------------------------------------

    def _failed(self, what: str, exc: StateUnavailable) -> None:
        if self.available:
            log.warning(
                "fleet_spend_unavailable",
                host_id=self.host_id,
                during=what,
                error=str(exc),
                dirty_windows=len(self._dirty),
            )
        self.available = False

    def _recovered(self) -> None:
        if not self.available:
            log.info("fleet_spend_available", host_id=self.host_id)
        self.available = True
