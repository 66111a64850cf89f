"""Fan-out across the fleet (SPEC §16): events to every host's feed, and account-wide revocation.

`FleetEvents`: the `account.state`, `circuit` and `policy` events a host publishes reach every
other host's feed through one pub/sub channel. Pub/sub is at-most-once: a host disconnected
from Redis misses what was published meanwhile; the state behind each event (the chains, the
circuits) is in Redis and re-read, so only the notification is lost, never the state.

`FleetRevocations`: `revoke-leases` on one host reaches every live host and answers which did
not acknowledge within the bound. Requests go through a stream (a host that reconnects reads
what it missed, from the last entry it handled), acknowledgements into a per-request hash (host
→ the leases it ended, with a TTL), and a pub/sub wake-up lets the requester wait without
polling. A handler that fails does not acknowledge: its host is named as missing.

Nothing read here is believed unless a host of the fleet wrote it (SPEC §19): every event,
request and acknowledgement carries a MAC (`shared/fleet/entries.py`), is decoded strictly, and
one that fails is skipped, logged once and counted; it never stops the loop that read it.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import Any

import msgspec
import redis.asyncio as aredis

from controlplane.events import EventKind
from shared.capacity import StateUnavailable
from shared.fleet.entries import EntryKind, FleetEntries, Why
from shared.fleet.keys import FleetKeys
from shared.fleet.redis_client import guard, raise_if_cancelled
from shared.logging import get_logger

log = get_logger("fleet")

FANNED_OUT = frozenset({EventKind.ACCOUNT_STATE, EventKind.CIRCUIT, EventKind.POLICY})
ACK_TIMEOUT_S = 5.0  # SPEC §16: revoke-leases names any host that did not ack within 5 s
ACK_TTL_MS = 60_000  # an acknowledgement set outlives its requester's wait
STREAM_MAXLEN = 1_000  # requests kept for a host that reconnects (approximate trim)
BLOCK_MS = 250  # a stream read waits this long (below the client's socket timeout)
RETRY_S = 0.5  # a listener that lost Redis tries again this often


class FleetEvent(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    kind: EventKind
    host_id: str  # the host that published it
    data: dict[str, Any]
    mac: str = ""  # SPEC §19: over kind, host and the data's canonical JSON


class RevokeRequest(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    account_id: str
    from_host: str
    at_ms: int = 0  # Redis's clock at the request (the stream entry's id)


class RevokeAnswer(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    acked: tuple[str, ...]
    missing: tuple[str, ...]  # live hosts that did not acknowledge within the bound
    revoked: int = 0  # leases ended, summed over the hosts that acknowledged


_encode = msgspec.json.Encoder().encode
_encode_sorted = msgspec.json.Encoder(order="sorted").encode
_decode_event = msgspec.json.Decoder(FleetEvent).decode
REQUEST_ID = re.compile(r"^rv-[0-9a-f]{16}$")
HOST_ID = re.compile(r"^[a-z0-9][a-z0-9.-]{0,62}$")
REQUEST_FIELDS = frozenset({b"request_id", b"account_id", b"from_host", b"mac"})
ID_MAX = 256  # an account id longer than this is not one


def _event_fields(event: FleetEvent) -> list[Any]:
    return [str(event.kind), event.host_id, _encode_sorted(event.data)]


class FleetEvents:
    def __init__(self, client: aredis.Redis, keys: FleetKeys, host_id: str, *, entries: FleetEntries) -> None:
        self.client = client
        self.keys = keys
        self.host_id = host_id
        self.entries = entries

    async def publish(self, kind: EventKind, data: dict[str, Any]) -> int:
        """Send one event to every subscribed host; answers how many received it."""
        if kind not in FANNED_OUT:
            raise ValueError(f"{kind} stays on its host")
        event = FleetEvent(kind=kind, host_id=self.host_id, data=data)
        event = msgspec.structs.replace(event, mac=self.entries.mac(EntryKind.EVENT, _event_fields(event)))
        message = _encode(event)
        with guard("fleet event publish"):
            return int(await self.client.publish(self.keys.events, message))

    async def listen(self, *, ready: asyncio.Event | None = None) -> AsyncIterator[FleetEvent]:
        """Other hosts' events as they arrive (this host's own are skipped). Raises
        `StateUnavailable` when Redis is lost; `run` is the loop that survives that."""
        pubsub = self.client.pubsub()
        try:
            await subscribe(pubsub, self.keys.events)
            if ready is not None:
                ready.set()
            while True:
                raise_if_cancelled()
                with guard("fleet event listen"):
                    message = await pubsub.get_message(timeout=1.0)
                if message is None or message.get("type") != "message":
                    continue
                event = self._event_of(message.get("data"))
                if event is not None and event.host_id != self.host_id:
                    yield event
        finally:
            try:
                await pubsub.aclose()
            except Exception:
                pass

    def _event_of(self, data: object) -> FleetEvent | None:
        """A message as an event of the fleet, or None (rejected: logged once, counted)."""
        try:
            event = _decode_event(data) if isinstance(data, bytes) else None
        except (msgspec.DecodeError, msgspec.ValidationError):
            event = None
        if event is None:
            self.entries.reject(EntryKind.EVENT, self.keys.events, Why.DECODE)
            return None
        if not self.entries.valid(EntryKind.EVENT, _event_fields(event), event.mac):
            self.entries.reject(EntryKind.EVENT, self.keys.events, Why.MAC)
            return None
        if event.kind not in FANNED_OUT or not HOST_ID.match(event.host_id):
            self.entries.reject(EntryKind.EVENT, self.keys.events, Why.RANGE)
            return None
        return event

    async def run(self, handle: Callable[[FleetEvent], Awaitable[None]], *, ready: asyncio.Event | None = None) -> None:
        """Hand every other host's event to `handle`, resubscribing after an outage; `ready` is
        set once the first subscription is confirmed."""
        while True:
            raise_if_cancelled()
            try:
                async for event in self.listen(ready=ready):
                    await handle(event)
            except StateUnavailable as exc:
                log.warning("fleet_events_lost", error=str(exc))
            await asyncio.sleep(RETRY_S)


class FleetRevocations:
    def __init__(
        self,
        client: aredis.Redis,
        keys: FleetKeys,
        host_id: str,
        *,
        entries: FleetEntries,
        ack_timeout_s: float = ACK_TIMEOUT_S,
        block_ms: int = BLOCK_MS,
    ) -> None:
        self.client = client
        self.keys = keys
        self.host_id = host_id
        self.entries = entries
        self.ack_timeout_s = ack_timeout_s
        self.block_ms = block_ms
        self.position: str | None = None  # the last request `serve` handled (a restart resumes there)

    async def request(self, account_id: str, hosts: Collection[str]) -> RevokeAnswer:
        """Ask every host to end the account's leases; wait until each of `hosts` (the live
        ones, this one included) acknowledged, or the bound passed."""
        request_id = "rv-" + secrets.token_hex(8)
        acks_key = self.keys.revoke_acks(request_id)
        pubsub = self.client.pubsub()
        try:
            await subscribe(pubsub, self.keys.revoke_acked)  # before the request: no wake-up lost
            with guard("fleet revoke request"):
                tag = self.entries.mac(EntryKind.REVOKE, [request_id, account_id, self.host_id])
                await self.client.xadd(
                    self.keys.revoke,
                    {"request_id": request_id, "account_id": account_id, "from_host": self.host_id, "mac": tag},
                    maxlen=STREAM_MAXLEN,
                    approximate=True,
                )
                deadline = time.monotonic() + self.ack_timeout_s
                while True:
                    counts = self._acks_of(request_id, await self.client.hgetall(acks_key))
                    acked = set(counts)
                    left = deadline - time.monotonic()
                    if set(hosts) <= acked or left <= 0:
                        break
                    await pubsub.get_message(timeout=min(left, 1.0))
        finally:
            try:
                await pubsub.aclose()
            except Exception:
                pass
        return RevokeAnswer(
            request_id=request_id,
            acked=tuple(sorted(acked)),
            missing=tuple(sorted(set(hosts) - acked)),
            revoked=sum(counts.values()),
        )

    async def requests_since(self, at_ms: int) -> list[RevokeRequest]:
        """The requests still in the stream made at or after `at_ms` (Redis's clock): what a
        host that was down missed (a restart resumes from the newest entry, `serve`)."""
        with guard("fleet revoke history"):
            entries = await self.client.xrange(self.keys.revoke, min=f"{max(0, at_ms)}-0")
        requests = (self._request_of(entry_id.decode(), fields) for entry_id, fields in entries)
        return [request for request in requests if request is not None]

    async def serve(
        self,
        handle: Callable[[RevokeRequest], Awaitable[int | None]],
        *,
        ready: asyncio.Event | None = None,
        after: str | None = None,
    ) -> None:
        """Run `handle` for every request from now on (or after the entry `after`; this host's
        own included) and acknowledge each it completed (with the leases it ended); after an
        outage, go on from the last request handled."""
        last_id: str | None = after
        if after is not None and ready is not None:
            ready.set()
        while True:
            raise_if_cancelled()
            try:
                if last_id is None:
                    last_id = self.position = await self.last_id()
                    if ready is not None:
                        ready.set()
                last_id = self.position = await self._serve_batch(last_id, handle)
            except StateUnavailable as exc:
                log.warning("fleet_revocations_lost", error=str(exc))
                await asyncio.sleep(RETRY_S)

    async def last_id(self) -> str:
        """The newest request's entry id ("0-0" when there is none)."""
        with guard("fleet revoke stream"):
            newest = await self.client.xrevrange(self.keys.revoke, count=1)
        return newest[0][0].decode() if newest else "0-0"

    async def _serve_batch(self, last_id: str, handle: Callable[[RevokeRequest], Awaitable[int | None]]) -> str:
        with guard("fleet revoke read"):
            batches = await self.client.xread({self.keys.revoke: last_id}, count=32, block=self.block_ms)
        for _stream, entries in batches or ():
            for entry_id, fields in entries:
                last_id = entry_id.decode()
                request = self._request_of(last_id, fields)
                if request is None:
                    continue
                try:
                    ended = await handle(request)
                except Exception as exc:  # not acknowledged: the requester names this host
                    log.error(
                        "fleet_revoke_failed",
                        request_id=request.request_id,
                        account_id=request.account_id,
                        error=repr(exc),
                    )
                    continue
                await self._ack(request.request_id, ended or 0)
        return last_id

    async def _ack(self, request_id: str, ended: int) -> None:
        acks_key = self.keys.revoke_acks(request_id)
        with guard("fleet revoke ack"):
            async with self.client.pipeline(transaction=True) as pipe:
                tag = self.entries.mac(EntryKind.REVOKE_ACK, [request_id, self.host_id, ended])
                pipe.hset(acks_key, self.host_id, f"{ended}:{tag}")
                pipe.pexpire(acks_key, ACK_TTL_MS)
                pipe.publish(self.keys.revoke_acked, request_id)
                await pipe.execute()

    def _request_of(self, entry_id: str, fields: dict[bytes, bytes]) -> RevokeRequest | None:
        """A stream entry as a request of the fleet, or None (rejected: logged once, counted)."""
        where = f"{self.keys.revoke}#{entry_id}"
        try:
            if set(fields) != REQUEST_FIELDS:
                raise ValueError("fields")
            request_id, account_id, from_host, tag = (
                fields[name].decode() for name in (b"request_id", b"account_id", b"from_host", b"mac")
            )
            at_ms = int(entry_id.split("-")[0])
        except (ValueError, TypeError, AttributeError):  # a UnicodeDecodeError is a ValueError
            self.entries.reject(EntryKind.REVOKE, where, Why.DECODE)
            return None
        if not self.entries.valid(EntryKind.REVOKE, [request_id, account_id, from_host], tag):
            self.entries.reject(EntryKind.REVOKE, where, Why.MAC)
            return None
        if not REQUEST_ID.match(request_id) or not HOST_ID.match(from_host) or not 0 < len(account_id) <= ID_MAX:
            self.entries.reject(EntryKind.REVOKE, where, Why.RANGE)
            return None
        return RevokeRequest(request_id=request_id, account_id=account_id, from_host=from_host, at_ms=at_ms)

    def _acks_of(self, request_id: str, raw: dict[bytes, bytes]) -> dict[str, int]:
        """The acknowledgements a host of the fleet made (host → leases ended); others rejected."""
        counts: dict[str, int] = {}
        where = self.keys.revoke_acks(request_id)
        for host_raw, value in raw.items():
            try:
                host, (ended_raw, tag) = host_raw.decode(), value.decode().split(":", 1)
                ended = int(ended_raw)
            except (ValueError, AttributeError):
                self.entries.reject(EntryKind.REVOKE_ACK, where, Why.DECODE)
                continue
            if not self.entries.valid(EntryKind.REVOKE_ACK, [request_id, host, ended], tag):
                self.entries.reject(EntryKind.REVOKE_ACK, where, Why.MAC)
            elif ended < 0 or not HOST_ID.match(host):
                self.entries.reject(EntryKind.REVOKE_ACK, where, Why.RANGE)
            else:
                counts[host] = ended
        return counts


async def subscribe(pubsub: Any, channel: str, timeout_s: float = 2.0) -> None:
    """Subscribe and wait for Redis to confirm it, so nothing published afterwards is missed."""
    deadline = time.monotonic() + timeout_s
    with guard("fleet subscribe"):
        await pubsub.subscribe(channel)
        while time.monotonic() < deadline:
            message = await pubsub.get_message(timeout=deadline - time.monotonic())
            if message is not None and message.get("type") == "subscribe":
                return
    raise StateUnavailable(f"the subscription to {channel} was not confirmed within {timeout_s:g}s")
