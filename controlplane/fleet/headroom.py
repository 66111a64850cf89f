"""`FleetHeadroom`: rate-limit observations shared fleet-wide, the newest wins (SPEC §22, §16).

One Redis hash, `{f}:headroom`: field `<account_id>/<kind>` → `<observed_at_ms>:<mac><entry>`,
the entry the msgpack `Entry` of the observation and the host that made it, the MAC (43
characters, `EntryKind.HEADROOM`) over the field and the entry's bytes.

- **Out**: every observation this host takes from its own rows (`HeadroomBook.observed_listeners`
  → `note`) is written within `PUBLISH_MIN_S`, coalesced per account and kind; a Lua script
  keeps, per field, only the newest (`observed_at_ms` prefix compared on Redis, so two hosts
  racing never let an older one win).
- **In**: every `PULL_S` the whole hash is read (at most accounts × 4 fields) and each entry
  merged into the book, which keeps it only where it is newer. So a host's mints skip an
  account another host saw run low within about `PUBLISH_MIN_S + PULL_S`.
- **Hostile entries** (SPEC §19: the fleet's store is trusted for availability, not for
  integrity): a value whose MAC does not verify for its field (written without the fleet
  secret, or moved from another field), that does not decode strictly (`Entry`, unknown fields
  refused), names no account of the registry or no kind, whose prefix disagrees with its entry,
  or holds a value out of range (`core.headroom.valid`; an observation from more than
  `FUTURE_SKEW_MS` ahead) is skipped, logged once (`fleet_entry_rejected`, naming the key and
  field, never the value) and counted (`leasehold_fleet_entries_rejected_total{kind="headroom"}`);
  it never stops the loop. So a Redis writer cannot make a host skip an account with a forged
  low headroom. The `observed_at_ms` prefix stays outside the MAC'd bytes for the Lua script's
  newest-wins comparison; a forged prefix is caught on read (it must equal the MAC'd entry's).
- **Authentication**: `seal` / `unseal` are the one place an entry's bytes are made and
  believed.
- **Redis away**: what is not published stays owed (newest kept) and the book keeps what it
  has; both loops go on after `RETRY_S`. Nothing here holds a mint: headroom steers, it is no
  promise (SPEC §16's promises are capacity, circuits, decisions, chains).
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import redis.asyncio as aredis

from controlplane.core.headroom import Observation, valid
from controlplane.headroom import HeadroomBook
from shared.capacity import StateUnavailable
from shared.clock import now_ms
from shared.fleet.entries import EntryKind, FleetEntries, Why
from shared.fleet.keys import FleetKeys
from shared.fleet.redis_client import guard, raise_if_cancelled
from shared.logging import get_logger
from shared.settings import HOST_ID_RE
from shared.wire import RATE_LIMIT_KINDS

log = get_logger("fleet")

PUBLISH_MIN_S = 0.1
PULL_S = 0.5
RETRY_S = 1.0
HEADROOM_TTL_S = 86_400  # the hash outlives its last write by a day (resets are minutes)
FUTURE_SKEW_MS = 60_000  # an observation further ahead of this host's clock is garbage
FIELD_LOGGED_MAX = 200  # a rejected field's name is logged up to this many characters
MAC_LEN = 43  # an entry MAC's length (`shared.fleet.secret.mac`: unpadded base64)

# KEYS: the hash; ARGV: ttl ms, then (field, observed_at_ms, value) triples. Per field the
# newest observed_at wins; a tie keeps what is there.
PUBLISH = """
for i = 2, #ARGV, 3 do
  local held = redis.call('HGET', KEYS[1], ARGV[i])
  local at = held and tonumber(string.match(held, '^(%d+):'))
  if not at or at < tonumber(ARGV[i + 1]) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 2])
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"""


class Entry(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """One published observation (msgpack, positional)."""

    limit: int | None
    remaining: int
    reset_at_ms: int | None
    observed_at_ms: int
    host_id: str


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Entry).decode


def seal(entries: FleetEntries, field: str, payload: bytes) -> bytes:
    """The bytes published for an entry: its MAC (over the field and the entry) then the entry."""
    return entries.mac(EntryKind.HEADROOM, [field, payload]).encode() + payload


def unseal(entries: FleetEntries, field: str, raw: bytes) -> bytes | None:
    """The entry's bytes if its MAC verifies for this field, else None (SPEC §19)."""
    tag, payload = raw[:MAC_LEN], raw[MAC_LEN:]
    if not entries.valid(EntryKind.HEADROOM, [field, payload], tag.decode("ascii", "replace")):
        return None
    return payload


def encode_value(entries: FleetEntries, account_id: str, kind: str, observation: Observation, host_id: str) -> bytes:
    entry = Entry(
        limit=observation.limit,
        remaining=observation.remaining,
        reset_at_ms=observation.reset_at_ms,
        observed_at_ms=observation.observed_at_ms,
        host_id=host_id,
    )
    sealed = seal(entries, f"{account_id}/{kind}", _encode(entry))
    return str(observation.observed_at_ms).encode() + b":" + sealed


def decode_entry(
    entries: FleetEntries, field: bytes, value: bytes, accounts: frozenset[str], now: int
) -> tuple[str, str, Observation] | Why:
    """A field and its value → (account, kind, observation), or why it is not believed."""
    try:
        name = field.decode()
    except UnicodeDecodeError:
        return Why.DECODE
    account_id, slash, kind = name.partition("/")
    prefix, colon, sealed = value.partition(b":")
    if not colon:
        return Why.DECODE
    payload = unseal(entries, name, sealed)
    if payload is None:
        return Why.MAC
    try:
        entry = _decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return Why.DECODE
    if (
        not slash
        or account_id not in accounts
        or kind not in RATE_LIMIT_KINDS
        or not prefix.isdigit()
        or int(prefix) != entry.observed_at_ms
        or not HOST_ID_RE.match(entry.host_id)
        or entry.observed_at_ms > now + FUTURE_SKEW_MS
    ):
        return Why.RANGE
    observation = Observation(
        limit=entry.limit, remaining=entry.remaining, reset_at_ms=entry.reset_at_ms, observed_at_ms=entry.observed_at_ms
    )
    return (account_id, kind, observation) if valid(observation) else Why.RANGE


class FleetHeadroom:
    def __init__(
        self, client: aredis.Redis, keys: FleetKeys, host_id: str, book: HeadroomBook, *, entries: FleetEntries
    ) -> None:
        self.client = client
        self.key = keys.headroom
        self.host_id = host_id
        self.book = book
        self.entries = entries  # SPEC §19: what is published, MAC'd; what is read, checked and counted
        self.available = True
        self._owed: dict[tuple[str, str], Observation] = {}
        self._wake = asyncio.Event()
        self._script = client.register_script(PUBLISH)
        self._tasks: list[asyncio.Task[Any]] = []

    def note(self, account_id: str, kind: str, observation: Observation) -> None:
        """`HeadroomBook.observed_listeners`: an observation of this host's, to publish."""
        self._owed[(account_id, kind)] = observation
        self._wake.set()

    def wake(self) -> None:
        """`HeadroomBook.on_pending`: a row's observations wait in the book; publish them."""
        self._wake.set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._publisher()), loop.create_task(self._puller())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def publish(self) -> None:
        self.book.fold()  # the rows' observations wait in the book until read (`HeadroomBook.on_row`)
        owed, self._owed = self._owed, {}
        if not owed:
            return
        args: list[Any] = [HEADROOM_TTL_S * 1000]
        for (account_id, kind), observation in owed.items():
            args += [
                f"{account_id}/{kind}",
                observation.observed_at_ms,
                encode_value(self.entries, account_id, kind, observation, self.host_id),
            ]
        try:
            with guard("headroom publish"):
                await self._script(keys=[self.key], args=args)
        except BaseException:
            for key, observation in owed.items():  # owed again, unless a newer one arrived meanwhile
                held = self._owed.get(key)
                if held is None or held.observed_at_ms < observation.observed_at_ms:
                    self._owed[key] = observation
            raise

    async def pull(self) -> int:
        """Merge the fleet's observations into the book; how many were newer than the book's."""
        with guard("headroom pull"):
            entries = await self.client.hgetall(self.key)
        now, merged = now_ms(), 0
        for field, value in entries.items():
            decoded = decode_entry(self.entries, field, value, self.book.accounts, now)
            if isinstance(decoded, Why):
                where = f"{self.key}#{field.decode('utf-8', 'replace')[:FIELD_LOGGED_MAX]}"
                self.entries.reject(EntryKind.HEADROOM, where, decoded)
                continue
            if self.book.merge(*decoded):
                merged += 1
        return merged

    async def _publisher(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            raise_if_cancelled()
            try:
                await self.publish()
                self._health(None)
            except StateUnavailable as exc:
                self._health(exc)
                await asyncio.sleep(RETRY_S)
                self._wake.set()
                continue
            await asyncio.sleep(PUBLISH_MIN_S)

    async def _puller(self) -> None:
        while True:
            await asyncio.sleep(PULL_S)
            raise_if_cancelled()
            try:
                await self.pull()
                self._health(None)
            except StateUnavailable as exc:
                self._health(exc)
                await asyncio.sleep(RETRY_S)
            except Exception:  # supervised: a bug in one pass must not end the loop
                log.exception("fleet_headroom_pull_failed")
                await asyncio.sleep(RETRY_S)

    def _health(self, failure: StateUnavailable | None) -> None:
        if failure is not None and self.available:
            log.warning("fleet_headroom_unavailable", host_id=self.host_id, error=str(failure))
        elif failure is None and not self.available:
            log.info("fleet_headroom_available", host_id=self.host_id)
        self.available = failure is None
