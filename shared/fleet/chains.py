"""`RedisChainStorage`: a chain's bytes in Redis, the fleet's authority (SPEC §9, §10, §16).

The records are one Redis string (appended with APPEND), the anchor another; a revision
counter moves with every append and anchor write, in the same script, so `version()` is one
cheap round trip (counter, length, anchor) whatever the chain's length. `append` is a Lua
compare-and-set on the records' length, so two hosts can never both extend the same chain;
it also checks that the caller still holds the writer's lock. The lock is `SET NX PX` with
a random owner id, released by compare-and-delete, waited for at most `LOCK_TIMEOUT_S`
(then `ChainBusy`). The lock is a lease (`LOCK_LEASE_S`): a writer that died frees it by
expiry; a writer that outlived it finds its append refused, never a forked chain.

`HashChain` calls its storage synchronously from worker threads (and reads from the event
loop): this storage uses the blocking client, whose every wait is bounded (see
`redis_client.py`). An unreachable Redis raises `StateUnavailable`, not `OSError`: a chain
that cannot be read is unavailable, not corrupt. Durability is the Redis server's (its
`appendonly`/`fsync` and replication settings); a chain Redis lost is re-seeded from a host's
verified mirror (`mirror.py`), never read as an empty chain.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
import redis.asyncio as aredis

import shared.chainstorage as chainstorage
from shared.chainstorage import ChainBusy, ChainBytes, RevisionConflict
from shared.fleet.keys import FleetKeys
from shared.fleet.redis_client import guard

LOCK_LEASE_S = 60.0  # longer than any commit (a revoke-leases waits 5 s for the fleet)
LOCK_POLL_S = 0.02  # a waiting writer (a worker thread) looks again this often

# KEYS: records, rev, lock, seeded; ARGV: line, expected size, owner. 1 ok, 0 size moved,
# -1 lock lost. A write ends a re-seed's window (no mirror may extend the seed after it).
APPEND = """
if redis.call('GET', KEYS[3]) ~= ARGV[3] then return -1 end
if redis.call('STRLEN', KEYS[1]) ~= tonumber(ARGV[2]) then return 0 end
redis.call('APPEND', KEYS[1], ARGV[1])
redis.call('INCR', KEYS[2])
redis.call('DEL', KEYS[4])
return 1
"""

# KEYS: records, anchor, rev, seeded; ARGV: records, anchor. Only into a chain Redis lost
# entirely (no records and no anchor): the re-seed from a verified mirror.
SEED = """
if redis.call('STRLEN', KEYS[1]) ~= 0 or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
redis.call('INCR', KEYS[3])
redis.call('SET', KEYS[4], '1')
return 1
"""

# KEYS: records, anchor, rev, seeded; ARGV: suffix, expected size, anchor. A longer verified
# mirror extends a seed no one has written after (two hosts noticed the loss; the longer wins).
EXTEND_SEED = """
if redis.call('EXISTS', KEYS[4]) == 0 then return 0 end
if redis.call('STRLEN', KEYS[1]) ~= tonumber(ARGV[2]) then return 0 end
redis.call('APPEND', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[3])
redis.call('INCR', KEYS[3])
return 1
"""

# KEYS: anchor, rev, lock; ARGV: anchor, owner
WRITE_ANCHOR = """
if redis.call('GET', KEYS[3]) ~= ARGV[2] then return -1 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('INCR', KEYS[2])
return 1
"""

# KEYS: lock; ARGV: owner
UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: records, anchor. One atomic read (the two anchor reads are the same read).
READ = """
local anchor = redis.call('GET', KEYS[2])
return {anchor, redis.call('GET', KEYS[1])}
"""

# KEYS: records, anchor, rev
VERSION = """
return {redis.call('GET', KEYS[3]), redis.call('STRLEN', KEYS[1]), redis.call('GET', KEYS[2])}
"""


class LockLost(OSError):
    """The writer's lock expired (or was taken) before its write: nothing was written."""


class RedisChainStorage:
    """A `ChainStorage` in Redis, named `name` within the fleet (`account-admin`, `policy`)."""

    def __init__(self, client: redis.Redis, keys: FleetKeys, name: str, aclient: aredis.Redis | None = None) -> None:
        self.client = client
        self.name = name
        self.records_key = keys.chain(name, "records")
        self.anchor_key = keys.chain(name, "anchor")
        self.rev_key = keys.chain(name, "rev")
        self.lock_key = keys.chain(name, "lock")
        self.seeded_key = keys.chain(name, "seeded")
        self._append = client.register_script(APPEND)
        self._seed = client.register_script(SEED)
        self._extend_seed = client.register_script(EXTEND_SEED)
        self._write_anchor = client.register_script(WRITE_ANCHOR)
        self._unlock = client.register_script(UNLOCK)
        self._read = client.register_script(READ)
        self._version = client.register_script(VERSION)
        # `version_async`: asked on the event loop, no thread (a mint's refresh; issue 27)
        self._version_async = None if aclient is None else aclient.register_script(VERSION)
        self._owner = threading.local()  # the lock's owner id, in the thread that holds it

    def read(self) -> ChainBytes:
        with guard(f"chain {self.name} read"):
            anchor, data = self._read(keys=[self.records_key, self.anchor_key])
        return ChainBytes(anchor, data or b"", anchor)

    def version(self) -> tuple[Any, ...]:
        with guard(f"chain {self.name} version"):
            rev, size, anchor = self._version(keys=[self.records_key, self.anchor_key, self.rev_key])
        return (rev, size, anchor)

    async def version_async(self) -> tuple[Any, ...] | None:
        """`version`, asked with the asyncio client; None without one."""
        if self._version_async is None:
            return None
        with guard(f"chain {self.name} version"):
            rev, size, anchor = await self._version_async(keys=[self.records_key, self.anchor_key, self.rev_key])
        return (rev, size, anchor)

    def tail(self) -> bytes:
        with guard(f"chain {self.name} tail"):
            return self.client.getrange(self.records_key, -chainstorage.TAIL_BYTES, -1) or b""

    def size(self) -> int:
        with guard(f"chain {self.name} size"):
            return int(self.client.strlen(self.records_key))

    @contextmanager
    def writer(self) -> Iterator[None]:
        owner = "lock-" + secrets.token_hex(8)
        timeout_s = chainstorage.LOCK_TIMEOUT_S
        deadline = time.monotonic() + timeout_s
        while True:
            with guard(f"chain {self.name} lock"):
                if self.client.set(self.lock_key, owner, nx=True, px=int(LOCK_LEASE_S * 1000)):
                    break
            if time.monotonic() >= deadline:
                raise ChainBusy(f"chain {self.name} held by another writer for more than {timeout_s:g}s")
            time.sleep(LOCK_POLL_S)  # a worker thread's bounded wait, as filelock's own poll
        self._owner.value = owner
        try:
            yield
        finally:
            self._owner.value = None
            try:
                with guard(f"chain {self.name} unlock"):
                    self._unlock(keys=[self.lock_key], args=[owner])
            except Exception:  # an unreachable Redis frees the lock by its lease instead
                pass

    def append(self, line: bytes, expected_size: int) -> None:
        with guard(f"chain {self.name} append"):
            done = self._append(
                keys=[self.records_key, self.rev_key, self.lock_key, self.seeded_key],
                args=[line, expected_size, self._lock_owner()],
            )
        if done == -1:
            raise LockLost(f"chain {self.name}: the writer's lock lapsed before the append")
        if done == 0:
            raise RevisionConflict(-1, -1)  # only a writer ignoring the lock gets here

    def write_anchor(self, data: bytes) -> None:
        with guard(f"chain {self.name} anchor"):
            done = self._write_anchor(
                keys=[self.anchor_key, self.rev_key, self.lock_key], args=[data, self._lock_owner()]
            )
        if done == -1:
            raise LockLost(f"chain {self.name}: the writer's lock lapsed before the anchor write")

    # ---- re-seeding (mirror.py) --------------------------------------------------------------

    def seed(self, data: bytes, anchor: bytes) -> bool:
        """Write a whole verified chain into a chain Redis lost entirely; False if it is not
        empty any more (another host seeded first, or a writer appended)."""
        with guard(f"chain {self.name} seed"):
            return bool(self._seed(keys=self._seed_keys(), args=[data, anchor]) == 1)

    def extend_seed(self, suffix: bytes, expected_size: int, anchor: bytes) -> bool:
        """Extend a re-seeded chain nobody has written to since, from a longer verified mirror."""
        with guard(f"chain {self.name} extend seed"):
            return bool(self._extend_seed(keys=self._seed_keys(), args=[suffix, expected_size, anchor]) == 1)

    def is_seeded(self) -> bool:
        with guard(f"chain {self.name} seeded"):
            return bool(self.client.exists(self.seeded_key))

    def _seed_keys(self) -> list[str]:
        return [self.records_key, self.anchor_key, self.rev_key, self.seeded_key]

    def _lock_owner(self) -> str:
        return getattr(self._owner, "value", None) or ""
