"""The fleet's host registry: who is live, who holds a host id, and the reaper (SPEC §16).

Rule: time is Redis's (`TIME` inside every script), never a host's clock, so hosts whose clocks
disagree still agree on who is dead. A host is live while its last heartbeat is younger than
the TTL; one that is not (or that holds capacity with no heartbeat at all) is dead, and the
reaper releases everything it holds in one atomic script and bumps its epoch.

A host id is held by one process at a time, named by a random instance id:
- `claim` takes the id when nobody holds it, when the holder is this same instance, when the
  holder let go cleanly (`release`), or when the holder's heartbeat is past the TTL. A live
  holder's id is refused, with how long until its heartbeat expires: a restart after a crash
  waits that long once (the old instance cannot prove it is dead), a clean restart never waits.
- `heartbeat` answers the host's standing: `live`; `reaped` (the reaper declared it dead
  meanwhile: its holders were released, so it must end those leases and claim again); `superseded`
  (another instance holds the id now: stop); `state-lost` (the fleet's incarnation changed:
  Redis lost its data; claim again and re-register before admitting anything).

A granted claim and a live heartbeat are sealed with the fleet secret (`shared/fleet/beats.py`,
SPEC §19); `live_hosts` and `heartbeat_age_ms` believe only sealed heartbeats.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import msgspec
import redis.asyncio as aredis

from shared.codes import Standing
from shared.fleet import beats
from shared.fleet.capacity import RELEASE_HOST_FN
from shared.fleet.entries import FleetEntries
from shared.fleet.keys import Ceiling, FleetKeys
from shared.fleet.redis_client import guard

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: seen, instance, epoch, incarnation; ARGV: host, instance id, ttl ms, new incarnation.
# Answers {granted 0|1, epoch, incarnation, ms until the live holder's heartbeat expires, now}.
CLAIM = (
    _NOW
    + """
local inc = redis.call('GET', KEYS[4])
if not inc then
  inc = ARGV[4]
  redis.call('SET', KEYS[4], inc)
end
local epoch = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
local holder = redis.call('HGET', KEYS[2], ARGV[1])
local seen = redis.call('ZSCORE', KEYS[1], ARGV[1])
if holder and holder ~= ARGV[2] and seen then
  local left = tonumber(seen) + tonumber(ARGV[3]) - now
  if left > 0 then return {0, epoch, inc, left, now} end
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
return {1, epoch, inc, 0, now}
"""
)

# KEYS: seen, instance, epoch, incarnation; ARGV: host, instance id, epoch, incarnation.
# Answers {standing, epoch, now}.
HEARTBEAT = (
    _NOW
    + """
if redis.call('GET', KEYS[4]) ~= ARGV[4] then return {'state-lost', 0, now} end
local epoch = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
local holder = redis.call('HGET', KEYS[2], ARGV[1])
if holder and holder ~= ARGV[2] then return {'superseded', epoch, now} end
if (not holder) or epoch ~= tonumber(ARGV[3]) then return {'reaped', epoch, now} end
redis.call('ZADD', KEYS[1], now, ARGV[1])
return {'live', epoch, now}
"""
)

# KEYS: instance; ARGV: host, instance id. Compare-and-delete: only the holder lets go.
RELEASE = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return 1
end
return 0
"""

# Dead: heartbeat older than the TTL, or holding capacity with no heartbeat at all.
# ARGV: ttl ms, fleet prefix, then the capacity tables.
_FIND_DEAD = (
    _NOW
    + """
local function cap_of(i) return ARGV[2] .. 'cap:' .. ARGV[i] .. ':' end
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('(%d', now - tonumber(ARGV[1])))
local known = {}
for _, h in ipairs(dead) do known[h] = true end
for i = 3, #ARGV do
  for _, h in ipairs(redis.call('SMEMBERS', cap_of(i) .. 'hosts')) do
    if not known[h] and not redis.call('ZSCORE', KEYS[1], h) then
      known[h] = true
      dead[#dead + 1] = h
    end
  end
end
"""
)

# KEYS: seen
DEAD = _FIND_DEAD + "return dead"

# KEYS: seen, instance, epoch. Answers host, table, holder, account, ... for every holder
# released, and the dead hosts (some may have held nothing).
REAP = (
    RELEASE_HOST_FN
    + _FIND_DEAD
    + """
local out = {}
for _, h in ipairs(dead) do
  for i = 3, #ARGV do
    local released = release_host(cap_of(i), h)
    for j = 1, #released, 2 do
      out[#out + 1] = h
      out[#out + 1] = ARGV[i]
      out[#out + 1] = released[j]
      out[#out + 1] = released[j + 1]
    end
  end
  redis.call('ZREM', KEYS[1], h)
  redis.call('HDEL', KEYS[2], h)
  redis.call('HINCRBY', KEYS[3], h, 1)
end
return {dead, out}
"""
)

# KEYS: seen, beat; ARGV: ttl ms. Answers now, then host, last seen ms, its seal (or false), ...
LIVE = (
    _NOW
    + """
local live = redis.call('ZRANGEBYSCORE', KEYS[1], string.format('%d', now - tonumber(ARGV[1])), '+inf', 'WITHSCORES')
local out = {now}
for i = 1, #live, 2 do
  out[#out + 1] = live[i]
  out[#out + 1] = live[i + 1]
  out[#out + 1] = redis.call('HGET', KEYS[2], live[i])
end
return out
"""
)

# KEYS: seen, beat; ARGV: host. Answers {now, last seen ms (-1 if none), its seal (or false)}.
AGE = (
    _NOW
    + """
local seen = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not seen then return {now, -1, false} end
return {now, math.floor(tonumber(seen)), redis.call('HGET', KEYS[2], ARGV[1])}
"""
)


class HostClaim(msgspec.Struct, frozen=True, kw_only=True):
    granted: bool
    epoch: int  # times this host id was declared dead so far
    incarnation: str  # the fleet data's incarnation the claim was made in
    retry_after_ms: int = 0  # refused: until the live holder's heartbeat expires


class Beat(msgspec.Struct, frozen=True, kw_only=True):
    standing: Standing
    epoch: int


class Reaped(msgspec.Struct, frozen=True, kw_only=True):
    host_id: str
    table: Ceiling
    holder: str
    account_id: str


def new_instance_id() -> str:
    """A random id for this process (names it in the registry; grants nothing)."""
    return "inst-" + secrets.token_hex(8)


class HostRegistry:
    def __init__(
        self,
        client: aredis.Redis,
        keys: FleetKeys,
        ttl_s: float,
        tables: Sequence[Ceiling] = tuple(Ceiling),
        entries: FleetEntries | None = None,
    ) -> None:
        self.client = client
        self.entries = entries  # the fleet secret's MACs: heartbeats sealed and checked (SPEC §19)
        self.keys = keys
        self.ttl_ms = int(ttl_s * 1000)
        self.tables = tuple(tables)
        self._claim = client.register_script(CLAIM)
        self._heartbeat = client.register_script(HEARTBEAT)
        self._release = client.register_script(RELEASE)
        self._dead = client.register_script(DEAD)
        self._reap = client.register_script(REAP)
        self._live = client.register_script(LIVE)
        self._age = client.register_script(AGE)

    def _host_keys(self) -> list[str]:
        k = self.keys
        return [k.hosts_seen, k.hosts_instance, k.hosts_epoch, k.incarnation]

    async def claim(self, host_id: str, instance_id: str) -> HostClaim:
        with guard("host claim"):
            granted, epoch, incarnation, left, now = await self._claim(
                keys=self._host_keys(), args=[host_id, instance_id, self.ttl_ms, "inc-" + secrets.token_hex(8)]
            )
        if granted == 1:
            await self._seal(host_id, int(now))
        return HostClaim(
            granted=granted == 1, epoch=int(epoch), incarnation=incarnation.decode(), retry_after_ms=int(left)
        )

    async def heartbeat(self, host_id: str, instance_id: str, epoch: int, incarnation: str) -> Beat:
        with guard("host heartbeat"):
            standing, now_epoch, now = await self._heartbeat(
                keys=self._host_keys(), args=[host_id, instance_id, epoch, incarnation]
            )
        if standing == b"live":
            await self._seal(host_id, int(now))
        return Beat(standing=Standing(standing.decode()), epoch=int(now_epoch))

    async def release(self, host_id: str, instance_id: str) -> bool:
        """A clean stop lets go of the id (a restart claims it at once); the heartbeat is kept,
        so the host's holders are reaped only if no instance comes back within the TTL."""
        with guard("host release"):
            return bool(await self._release(keys=[self.keys.hosts_instance], args=[host_id, instance_id]) == 1)

    async def _seal(self, host_id: str, at_ms: int) -> None:
        """Vouch for the heartbeat just written (SPEC §19): a second write, with Redis's time."""
        if self.entries is not None:
            with guard("host heartbeat seal"):
                await self.client.hset(self.keys.hosts_beat, host_id, beats.seal(self.entries, host_id, at_ms))

    async def live_hosts(self) -> dict[str, int]:
        """host id → its last heartbeat (ms since the epoch, Redis's clock), for every live host
        (with the fleet secret: every host live on a sealed heartbeat)."""
        with guard("live hosts"):
            flat = await self._live(keys=[self.keys.hosts_seen, self.keys.hosts_beat], args=[self.ttl_ms])
        now, live = int(flat[0]), {}
        for i in range(1, len(flat), 3):
            host = flat[i].decode("utf-8", "replace")
            seen = self._believed(host, int(float(flat[i + 1])), flat[i + 2], now)
            if seen is not None and now - seen <= self.ttl_ms:
                live[host] = seen
        return live

    def _believed(self, host_id: str, score_ms: int, raw: bytes | None, now_ms: int) -> int | None:
        return beats.verified_seen(
            self.entries, f"{self.keys.hosts_beat}/{host_id}", host_id, score_ms, raw or None, now_ms, self.ttl_ms
        )

    async def heartbeat_age_ms(self, host_id: str) -> int | None:
        """How long ago `host_id` last heartbeated (Redis's clock); None when it holds no
        heartbeat (never joined, or declared dead and reaped)."""
        with guard("host heartbeat age"):
            now, score, raw = await self._age(keys=[self.keys.hosts_seen, self.keys.hosts_beat], args=[host_id])
        if int(score) < 0:
            return None
        seen = self._believed(host_id, int(score), raw, int(now))
        return None if seen is None else int(now) - seen

    async def dead_hosts(self) -> list[str]:
        with guard("dead hosts"):
            dead = await self._dead(keys=[self.keys.hosts_seen], args=self._reap_args())
        return sorted(h.decode() for h in dead)

    async def reap_dead(self) -> tuple[list[str], list[Reaped]]:
        """Declare every dead host dead, atomically: release all it holds in every table, drop
        its heartbeat and instance, bump its epoch. Answers the dead hosts and what was released
        (idempotent: any host may run it at any time; a second run finds nothing)."""
        with guard("reap dead hosts"):
            dead, flat = await self._reap(keys=self._host_keys()[:3], args=self._reap_args())
        released = [
            Reaped(
                host_id=flat[i].decode(),
                table=Ceiling(flat[i + 1].decode()),
                holder=flat[i + 2].decode(),
                account_id=flat[i + 3].decode(),
            )
            for i in range(0, len(flat), 4)
        ]
        return sorted(h.decode() for h in dead), released

    def _reap_args(self) -> list[str | int]:
        return [self.ttl_ms, self.keys.prefix, *[str(t) for t in self.tables]]
