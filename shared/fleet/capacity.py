"""`RedisCapacity`: a fleet-wide holder registry, one per ceiling (SPEC §6, §16).

Rule: registries, never counters. An account's count is the size of its holder hash, so a
release can only remove a holder that is there, and a lost reply can never leak or double a
slot (LiteLLM's leaked slots came from INCR/DECR). Reserve, release and the bulk operations
are server-side Lua scripts, each atomic: under any interleaving of hosts no account holds
more than its ceiling. Each holder is tagged with the host that reserved it, so a dead host's
holders can be released by whoever notices (`shared/fleet/hosts.py`).

Reserve and re-registration are fenced by the fleet's incarnation (`Incarnation`): once Redis
has lost its data they answer `StateLost` until this host has re-registered its holders, so
no host admits a new holder into a registry that does not yet hold the old ones.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from functools import partial

import redis.asyncio as aredis

from shared.capacity import StateUnavailable
from shared.fleet.keys import Ceiling, FleetKeys
from shared.fleet.redis_client import StateLost, guard
from shared.fleet.scriptline import ScriptLine, Sent
from shared.fleet.soon import failed, soon, soon_script

# A Lua function releasing every holder of one host in one table (also used by the reaper).
# Returns holder, account, holder, account, ...
RELEASE_HOST_FN = """
local function release_host(cap, host)
  local hk = cap .. 'host:' .. host
  local held = redis.call('HGETALL', hk)
  local out = {}
  for i = 1, #held, 2 do
    redis.call('HDEL', cap .. 'acct:' .. held[i + 1], held[i])
    redis.call('HDEL', cap .. 'owner', held[i])
    out[#out + 1] = held[i]
    out[#out + 1] = held[i + 1]
  end
  redis.call('DEL', hk)
  redis.call('SREM', cap .. 'hosts', host)
  return out
end
"""

# Take one slot; the same rules as `CapacityTable.reserve`. 1 taken (or already held here),
# 0 refused, -1 the fleet's incarnation is not the one this host registered into.
_TAKE_FN = """
local function take(cap, account, holder, host, ceiling)
  local owner = redis.call('HGET', cap .. 'owner', holder)
  if owner then
    if owner == account then return 1 end
    return 0
  end
  local acct = cap .. 'acct:' .. account
  if ceiling ~= '' and redis.call('HLEN', acct) >= tonumber(ceiling) then return 0 end
  redis.call('HSET', cap .. 'owner', holder, account)
  redis.call('HSET', acct, holder, host)
  redis.call('HSET', cap .. 'host:' .. host, holder, account)
  redis.call('SADD', cap .. 'hosts', host)
  return 1
end
local function fenced(key, expected)
  return expected ~= '' and redis.call('GET', key) ~= expected
end
"""

# KEYS: incarnation; ARGV: cap prefix, account, holder, host, ceiling ('' none), incarnation ('' unfenced)
RESERVE = (
    _TAKE_FN
    + """
if fenced(KEYS[1], ARGV[6]) then return -1 end
return take(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
"""
)

# Release one holder (the same steps as RELEASE below); 1 released, 0 it held nothing.
_RELEASE_FN = """
local function release(cap, holder)
  local account = redis.call('HGET', cap .. 'owner', holder)
  if not account then return 0 end
  local acct = cap .. 'acct:' .. account
  local host = redis.call('HGET', acct, holder)
  redis.call('HDEL', cap .. 'owner', holder)
  redis.call('HDEL', acct, holder)
  if host then
    local hk = cap .. 'host:' .. host
    redis.call('HDEL', hk, holder)
    if redis.call('EXISTS', hk) == 0 then redis.call('SREM', cap .. 'hosts', host) end
  end
  return 1
end
"""

# A reserve carrying the releases owed since the last round trip (issue 27: one round trip per
# request instead of two). KEYS: incarnation; ARGV: as RESERVE, then the holders to release
# first. Fenced like RESERVE, before anything is released (-1: nothing done).
RESERVE_RELEASING = (
    _TAKE_FN
    + _RELEASE_FN
    + """
if fenced(KEYS[1], ARGV[6]) then return -1 end
for i = 7, #ARGV do release(ARGV[1], ARGV[i]) end
return take(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
"""
)

# ARGV: cap prefix, then holders. Answers how many it released.
RELEASE_ALL = (
    _RELEASE_FN
    + """
local released = 0
for i = 2, #ARGV do released = released + release(ARGV[1], ARGV[i]) end
return released
"""
)

# KEYS: owner; ARGV: cap prefix, holder. 1 released, 0 it held nothing.
RELEASE = """
local account = redis.call('HGET', KEYS[1], ARGV[2])
if not account then return 0 end
local acct = ARGV[1] .. 'acct:' .. account
local host = redis.call('HGET', acct, ARGV[2])
redis.call('HDEL', KEYS[1], ARGV[2])
redis.call('HDEL', acct, ARGV[2])
if host then
  local hk = ARGV[1] .. 'host:' .. host
  redis.call('HDEL', hk, ARGV[2])
  if redis.call('EXISTS', hk) == 0 then redis.call('SREM', ARGV[1] .. 'hosts', host) end
end
return 1
"""

# ARGV: cap prefix, host
RELEASE_HOST = RELEASE_HOST_FN + "return release_host(ARGV[1], ARGV[2])"

# ARGV: cap prefix, host, then the holders to keep. Answers holder, account, ... released.
RETAIN_ONLY = """
local keep = {}
for i = 3, #ARGV do keep[ARGV[i]] = true end
local hk = ARGV[1] .. 'host:' .. ARGV[2]
local held = redis.call('HGETALL', hk)
local out = {}
for i = 1, #held, 2 do
  if not keep[held[i]] then
    redis.call('HDEL', ARGV[1] .. 'acct:' .. held[i + 1], held[i])
    redis.call('HDEL', ARGV[1] .. 'owner', held[i])
    redis.call('HDEL', hk, held[i])
    out[#out + 1] = held[i]
    out[#out + 1] = held[i + 1]
  end
end
if redis.call('EXISTS', hk) == 0 then redis.call('SREM', ARGV[1] .. 'hosts', ARGV[2]) end
return out
"""

# KEYS: incarnation; ARGV: cap prefix, host, incarnation, then (account, holder, ceiling)...
# Answers the holders it could not take back (-1 alone when fenced).
REREGISTER = (
    _TAKE_FN
    + """
if fenced(KEYS[1], ARGV[3]) then return -1 end
local refused = {}
for i = 4, #ARGV, 3 do
  if take(ARGV[1], ARGV[i], ARGV[i + 1], ARGV[2], ARGV[i + 2]) == 0 then
    refused[#refused + 1] = ARGV[i + 1]
  end
end
return refused
"""
)


class Incarnation:
    """Which life of the fleet's Redis data this process has registered its holders into.

    `value` None leaves the capacity scripts unfenced (a process that takes no part in
    re-registration); the host membership sets it after each (re-)registration.
    """

    def __init__(self, value: str | None = None) -> None:
        self.value = value

    def arg(self) -> str:
        return self.value or ""


class RedisCapacity:
    """A `CapacityStore` in Redis for one ceiling (`Ceiling.LEASE` at the mint, `Ceiling.REQUEST`
    at the proxy), each holder tagged with `host_id`. With a `line` (the data plane's), reserve
    and `release_all` go over that dedicated connection instead of the pool (issue 27)."""

    def __init__(
        self,
        client: aredis.Redis,
        keys: FleetKeys,
        table: Ceiling,
        host_id: str,
        incarnation: Incarnation | None = None,
        line: ScriptLine | None = None,
    ) -> None:
        self.client = client
        self.line = line
        self.keys = keys
        self.table = table
        self.host_id = host_id
        self.incarnation = incarnation or Incarnation()
        self._cap = keys.cap(table)
        self._reserve = client.register_script(RESERVE)
        self._release = client.register_script(RELEASE)
        self._release_host = client.register_script(RELEASE_HOST)
        self._reregister = client.register_script(REREGISTER)
        self._retain_only = client.register_script(RETAIN_ONLY)
        self._reserve_releasing = client.register_script(RESERVE_RELEASING)
        self._release_all = client.register_script(RELEASE_ALL)

    # ---- the CapacityStore contract --------------------------------------------------------

    def reserve(
        self, account_id: str, holder: str, ceiling: int | None, releasing: Sequence[str] = ()
    ) -> Awaitable[bool]:
        """Take a slot; `releasing`: holders to release first, in the same script (one round
        trip; nothing is released when the reserve is fenced, `StateLost`). Queued at the call
        on a batching client (`batching.soon`: a mint's claims gather no task for it)."""
        if self.line is not None:
            return self.send_reserve(account_id, holder, ceiling, releasing).taken()
        try:
            args = self._reserve_args(account_id, holder, ceiling, releasing)
        except ValueError as exc:  # a negative ceiling: the awaitable's failure, never the call's
            return failed(exc)
        script = self._reserve_releasing if releasing else self._reserve
        what = f"{self.table} capacity reserve"
        return soon_script(script, what, partial(_taken, table=self.table), [self.keys.incarnation], args)

    def send_reserve(
        self, account_id: str, holder: str, ceiling: int | None, releasing: Sequence[str] = ()
    ) -> SentReserve:
        """`reserve`'s script written on the line now, its answer read later (`SentReserve.taken`):
        the data plane prepares the upstream request meanwhile (issue 27). Needs a `line`."""
        assert self.line is not None
        script = self._reserve_releasing if releasing else self._reserve
        args = self._reserve_args(account_id, holder, ceiling, releasing)
        return SentReserve(self.line.send(script, [self.keys.incarnation], args), self.table)

    def _reserve_args(
        self, account_id: str, holder: str, ceiling: int | None, releasing: Sequence[str]
    ) -> list[str | int]:
        args: list[str | int] = [self._cap, account_id, holder, self.host_id, _ceiling(ceiling)]
        args.append(self.incarnation.arg())
        if releasing:
            args += releasing
        return args

    def release(self, holder: str) -> Awaitable[bool]:
        what = f"{self.table} capacity release"
        return soon_script(self._release, what, _is_one, [self.keys.cap_owner(self.table)], [self._cap, holder])

    async def release_all(self, holders: Sequence[str]) -> int:
        """Release every one of `holders` in one script; answers how many were held."""
        if not holders:
            return 0
        if self.line is not None:
            return _integer(await self.line.run(self._release_all, [], [self._cap, *holders]), "release")
        with guard(f"{self.table} capacity release"):
            return int(await self._release_all(args=[self._cap, *holders]))

    async def holds(self, holder: str) -> bool:
        with guard(f"{self.table} capacity holds"):
            return bool(await self.client.hexists(self.keys.cap_owner(self.table), holder))

    def count(self, account_id: str) -> Awaitable[int]:
        what = f"{self.table} capacity count"
        return soon(self.client, what, int, "HLEN", self.keys.cap_account(self.table, account_id))

    # ---- fleet operations -------------------------------------------------------------------

    async def counts_by_host(self, account_id: str) -> dict[str, int]:
        """How many holders each host holds on the account (the read plane's `hosts`)."""
        with guard(f"{self.table} capacity counts"):
            hosts = await self.client.hvals(self.keys.cap_account(self.table, account_id))
        counts: dict[str, int] = {}
        for host in hosts:
            counts[host.decode()] = counts.get(host.decode(), 0) + 1
        return counts

    async def holders_of_host(self, host_id: str) -> dict[str, str]:
        """holder → account of everything `host_id` holds in this table."""
        with guard(f"{self.table} capacity holders of host"):
            held = await self.client.hgetall(self.keys.cap_host(self.table, host_id))
        return {k.decode(): v.decode() for k, v in held.items()}

    async def release_host(self, host_id: str) -> dict[str, str]:
        """Release every holder of `host_id` at once; answers holder → account of those released."""
        with guard(f"{self.table} capacity release host"):
            flat = await self._release_host(args=[self._cap, host_id])
        return _pairs(flat)

    async def retain_only(self, holders: Sequence[str]) -> dict[str, str]:
        """Release every holder of this host but `holders` (a new instance of the host keeps
        what it restored, and lets go of what its dead predecessor held: in-flight attempts, a
        lease its journal never recorded); answers holder → account of those released."""
        with guard(f"{self.table} capacity retain"):
            flat = await self._retain_only(args=[self._cap, self.host_id, *holders])
        return _pairs(flat)

    async def reregister(
        self, holders: Sequence[tuple[str, str, int | None]], *, incarnation: str | None = None
    ) -> list[str]:
        """Take back this host's own live holders, `(account, holder, ceiling)` each, after
        Redis lost its data or after this host was declared dead; answers the holders refused.

        The ceiling is honoured, never bypassed (SPEC §16: no ceiling is exceeded): while this
        host was away, others may have filled the account, so a holder that no longer fits is
        refused, and its lease must be ended (its worker gets 401 and re-mints). Give the holders
        oldest first: the newest are the ones refused. A holder it already holds on the same
        account is kept; one held on another account is refused. One atomic script, fenced like
        `reserve` (by `incarnation` when given: the one a re-claim just answered).
        """
        if not holders:
            return []
        args = [self._cap, self.host_id, incarnation or self.incarnation.arg()]
        for account_id, holder, ceiling in holders:
            args += [account_id, holder, _ceiling(ceiling)]
        with guard(f"{self.table} capacity reregister"):
            refused = await self._reregister(keys=[self.keys.incarnation], args=args)
        if refused == -1:
            raise StateLost(f"{self.table} capacity: the fleet state changed during re-registration")
        return [h.decode() for h in refused]


class SentReserve:
    """A reserve written on the line (`RedisCapacity.send_reserve`), its answer still to read."""

    __slots__ = ("sent", "table")

    def __init__(self, sent: Sent, table: Ceiling) -> None:
        self.sent = sent
        self.table = table

    async def taken(self) -> bool:
        """`reserve`'s answer: taken or not; `StateLost` when fenced, else `StateUnavailable`."""
        return _taken(_integer(await self.sent.reply(), "reserve"), self.table)

    def cancel(self) -> None:
        """The answer will not be read (its outcome is the caller's to release)."""
        self.sent.cancel()


def _taken(taken: object, table: Ceiling) -> bool:
    if taken == -1:
        raise StateLost(f"{table} capacity: the fleet state was lost; re-register first")
    return bool(taken == 1)


def _is_one(reply: object) -> bool:
    return reply == 1


def _integer(reply: object, what: str) -> int:
    """A hot script's integer reply; anything else is `StateUnavailable` (never a guess)."""
    if type(reply) is not int:
        raise StateUnavailable(f"request capacity {what}: an unexpected reply {type(reply).__name__}")
    return reply


def _pairs(flat: Sequence[bytes]) -> dict[str, str]:
    return {flat[i].decode(): flat[i + 1].decode() for i in range(0, len(flat), 2)}


def _ceiling(ceiling: int | None) -> str:
    if ceiling is None:
        return ""
    if ceiling < 0:
        raise ValueError(f"a ceiling is a count, not {ceiling}")
    return str(ceiling)
