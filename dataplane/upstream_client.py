"""The upstream hop's HTTP/1.1 client: aiohttp's own response protocol, without its session.

aiohttp's `ClientSession.request` costs ~70 µs of CPU per exchange, most of it in per-request
machinery a pass-through does not use (a `ClientRequest` object, cookie jar, tracing, redirect
and auth handling, timers). This client keeps exactly the parts that decide the behaviour on the
wire and drops the rest:

- the request bytes are aiohttp's: its header serializer (the same CR/LF refusal), `Host` from
  the URL first, the forwarded headers in order, `Content-Length` for a body (and `0` for a
  bodiless method that expects one), no header of its own;
- the response is read by aiohttp's `ResponseHandler` and parser (framing, chunked and
  close-delimited bodies, header limits, flow control, its exceptions), 1xx answers skipped;
  its parser kept for a kept-alive connection's next answer where a fresh one would read it
  alike (`KeptAlive`);
- a malformed answer raises `aiohttp.ClientResponseError`; a refused, reset or lost
  connection an `aiohttp.ClientError`/`OSError`; a connect that outlasts
  `GATEWAY_UPSTREAM_CONNECT_TIMEOUT` a `TimeoutError` — what the relay already classifies;
- connections are kept alive per origin (30 s idle) and reused; a request on a reused
  connection that the upstream had closed is retried once on a fresh one only for an
  idempotent method, as aiohttp does; TLS with the same verified context aiohttp builds.

A request carrying `Expect` is handed to an aiohttp session instead (it waits for `100
Continue` before the body; nothing on the hot path does that).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import aiohappyeyeballs
import aiohttp
from aiohttp import ClientOSError, ServerDisconnectedError
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from dataplane.aiohttp_private import (
    EMPTY_BODY_METHODS,
    HttpProcessingError,
    KeptAlive,
    parse_content_type,
    serialize_headers,
)
from shared import deferred_ca

KEEPALIVE_S = 30.0
DNS_TTL_S = 60.0
# Methods aiohttp sends `Content-Length: 0` for when there is no body, and retries on a stale
# keep-alive connection.
_BODYLESS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
# Clean connections of one origin, oldest at the left, each with when it was parked.
Idle = deque[tuple[KeptAlive, float]]
# Above this a body is written after its headers instead of being joined to them.
_JOIN_LIMIT = 64 * 1024
# A URL (its object), its pool key, its `Host` value and its request target.
Target = tuple[URL, tuple[str, str, int], str | None, str]
TARGETS_MAX = 1024  # URLs whose `Target` a client keeps; cleared when full


def _tls_context() -> ssl.SSLContext:
    """What aiohttp verifies with: the default context, HTTP/1.1 by ALPN."""
    context = deferred_ca.create_default_context()
    context.set_alpn_protocols(("http/1.1",))
    return context


# The data plane's one verified context: this client's and the aiohttp sessions' (`UpstreamPools`,
# `UpstreamSockets`; aiohttp's own are never read). Its CA bundle is read on a thread once the
# daemon listens (`dataplane.main.serve`), off the path to ready, or at its first handshake.
UPSTREAM_TLS = _tls_context()


def request_head(method: str, host: str | None, target: str, headers: CIMultiDict[str], body: bytes | None) -> bytes:
    """The request line and headers, byte for byte as aiohttp's client writes them (`host` and
    `target`: the URL's `host_port_subcomponent` and `raw_path_qs`, `UpstreamClient._target`)."""
    out: CIMultiDict[str] = CIMultiDict()
    out["Host"] = host  # type: ignore[assignment]
    # As aiohttp's session prepares them: a name seen again in the same spelling is added, in
    # another spelling it replaces the earlier values (so the bytes on the wire do not change).
    seen: set[str] = set()
    for name, value in headers.items():
        if name in seen:
            out.add(name, value)
        else:
            out[name] = value
            seen.add(name)
    if "Content-Length" not in out:
        if body:
            out["Content-Length"] = str(len(body))
        elif method not in _BODYLESS:
            out["Content-Length"] = "0"
    return serialize_headers(f"{method} {target} HTTP/1.1", out)


class Withheld(Exception):
    """The request was not sent: `ready` answered `answer` (a refusal) instead of going ahead."""

    def __init__(self, answer: object) -> None:
        super().__init__()
        self.answer = answer


class UpstreamResponse:
    """The part of `aiohttp.ClientResponse` the relay uses."""

    __slots__ = ("status", "reason", "headers", "content", "_protocol", "_idle", "_client")

    def __init__(
        self, message: Any, payload: aiohttp.StreamReader, protocol: KeptAlive, idle: Idle, client: UpstreamClient
    ) -> None:
        self.status: int = message.code
        self.reason: str = message.reason
        self.headers: CIMultiDictProxy[str] = message.headers
        self.content = payload
        self._protocol: KeptAlive | None = protocol
        self._idle = idle
        self._client = client

    @property
    def content_type(self) -> str:
        raw = self.headers.get("Content-Type")
        return "application/octet-stream" if raw is None else parse_content_type(raw)[0]

    async def read(self) -> bytes:
        return await self.content.read()

    def release(self) -> None:
        """Back to the origin's keep-alive pool if the exchange left the connection clean."""
        protocol, self._protocol = self._protocol, None
        if protocol is None:
            return
        if protocol.should_close or not protocol.is_connected():
            protocol.close()
        else:
            self._client.park(self._idle, protocol)

    def close(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is not None:
            protocol.close()


class UpstreamClient:
    """Keep-alive connections to one account's upstream, and its exchanges."""

    def __init__(
        self,
        connect_timeout: float,
        make_fallback: Callable[[], aiohttp.ClientSession],
        tls: ssl.SSLContext = UPSTREAM_TLS,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.tls = tls
        self._make_fallback = make_fallback  # for what this client does not do itself (`Expect`)
        self._fallback: aiohttp.ClientSession | None = None
        self._idle: dict[tuple[str, str, int], Idle] = {}
        self._sweeping: asyncio.TimerHandle | None = None
        self._dns: dict[tuple[str, int], tuple[float, list[Any]]] = {}
        self._targets: dict[int, Target] = {}
        self.closed = False

    def _target(self, url: URL) -> Target:
        """`url`, its pool key, `Host` value and request target, read once per URL object: the
        relay's URLs come from `UpstreamPools.url_for`'s cache, and yarl's properties cost ~3k
        instructions per request (issue 27). Keyed by identity; the entry holds the URL, so its
        id is not reused while kept."""
        entry = self._targets.get(id(url))
        if entry is None or entry[0] is not url:
            if len(self._targets) >= TARGETS_MAX:
                self._targets.clear()
            key = (url.scheme, url.raw_host or "", url.port or 0)
            entry = self._targets[id(url)] = (url, key, url.host_port_subcomponent, url.raw_path_qs)
        return entry

    async def request(
        self,
        method: str,
        url: URL,
        headers: CIMultiDict[str],
        body: bytes | None,
        ready: Callable[[], Awaitable[object]] | None = None,
    ) -> UpstreamResponse | aiohttp.ClientResponse:
        """The exchange; with `ready`, awaited once right before the first byte is written (the
        request head built, the connection checked out): anything but None withholds the
        request (`Withheld`), the connection goes back to the pool untouched."""
        if "Expect" in headers:
            return await self._handed_over(method, url, headers, body, ready)
        _, key, host, target = self._target(url)
        head = request_head(method, host, target, headers, body)
        idle = self._idle.get(key)
        if idle is None:
            idle = self._idle[key] = deque()
        retry = method in _IDEMPOTENT
        while True:
            protocol = self._reuse(idle)
            reused = protocol is not None
            if ready is not None:  # the last wait before the first byte (nothing written yet);
                await self._ready(ready, idle, protocol)  # before any new connection is opened
                ready = None  # (a retry on a fresh connection does not ask again)
            if protocol is None:
                protocol = await self._connect(url)
            try:
                protocol.expect_response(method in EMPTY_BODY_METHODS)
                transport = protocol.transport
                assert transport is not None
                if body and len(body) > _JOIN_LIMIT:
                    transport.writelines((head, body))
                else:
                    transport.write(head + body if body else head)
                while True:
                    message, payload = await protocol.read()
                    if not 100 <= message.code <= 199 or message.code == 101:
                        break
            except (ServerDisconnectedError, ClientOSError):
                protocol.close()
                if reused and retry:
                    retry = False
                    continue
                raise
            except HttpProcessingError as exc:
                protocol.close()
                info = aiohttp.RequestInfo(url, method, CIMultiDictProxy(headers), url)
                raise aiohttp.ClientResponseError(
                    info, (), status=exc.code, message=exc.message, headers=exc.headers
                ) from exc
            except BaseException:
                protocol.close()  # cancelled or failed mid-exchange: never reused
                raise
            return UpstreamResponse(message, payload, protocol, idle, self)

    async def _handed_over(
        self,
        method: str,
        url: URL,
        headers: CIMultiDict[str],
        body: bytes | None,
        ready: Callable[[], Awaitable[object]] | None,
    ) -> aiohttp.ClientResponse:
        """A request carrying `Expect`, through an aiohttp session (`ready` asked first)."""
        if ready is not None:
            answer = await ready()
            if answer is not None:
                raise Withheld(answer)
        if self._fallback is None:
            self._fallback = self._make_fallback()
        return await self._fallback.request(method, url, data=body, headers=headers, allow_redirects=False)

    async def _ready(self, ready: Callable[[], Awaitable[object]], idle: Idle, protocol: KeptAlive | None) -> None:
        """Await `ready` before the first byte; unless it goes ahead, park the unused connection."""
        try:
            answer = await ready()
        except BaseException:
            if protocol is not None:
                self.park(idle, protocol)
            raise
        if answer is not None:
            if protocol is not None:
                self.park(idle, protocol)
            raise Withheld(answer)

    def park(self, idle: Idle, protocol: KeptAlive) -> None:
        """Keep a clean connection for the next exchange; a sweep closes it after 30 s unused."""
        loop = asyncio.get_running_loop()
        idle.append((protocol, loop.time()))
        if self._sweeping is None and not self.closed:
            self._sweeping = loop.call_later(KEEPALIVE_S, self._sweep)

    def _sweep(self) -> None:
        """Close connections unused for the keep-alive time (the oldest are at the left)."""
        self._sweeping = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        left = False
        for idle in self._idle.values():
            while idle and now - idle[0][1] >= KEEPALIVE_S:
                idle.popleft()[0].close()
            left = left or bool(idle)
        if left and not self.closed:
            self._sweeping = loop.call_later(KEEPALIVE_S, self._sweep)

    def _reuse(self, idle: Idle) -> KeptAlive | None:
        """The newest clean kept-alive connection (stale ones closed), or None."""
        if not idle:
            return None
        now = asyncio.get_running_loop().time()
        while idle:
            protocol, since = idle.pop()
            if now - since > KEEPALIVE_S or protocol.should_close or not protocol.is_connected():
                protocol.close()
                continue
            return protocol
        return None

    async def _connect(self, url: URL) -> KeptAlive:
        loop = asyncio.get_running_loop()
        host, port = url.raw_host or "", url.port or 0
        infos = await self._resolve(loop, host, port, loop.time())
        tls = url.scheme == "https"
        async with asyncio.timeout(self.connect_timeout):
            sock = await aiohappyeyeballs.start_connection(infos, happy_eyeballs_delay=0.25)
            try:
                _, protocol = await loop.create_connection(
                    lambda: KeptAlive(loop),
                    sock=sock,
                    ssl=self.tls if tls else None,
                    server_hostname=host.rstrip(".") if tls else None,
                )
            except BaseException:
                sock.close()
                raise
        return protocol

    async def _resolve(self, loop: asyncio.AbstractEventLoop, host: str, port: int, now: float) -> list[Any]:
        """Addresses of the upstream, kept `DNS_TTL_S` (aiohttp's connector did the same)."""
        cached = self._dns.get((host, port))
        if cached is not None and now < cached[0]:
            return cached[1]
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_ADDRCONFIG)
        if not infos:
            raise OSError(f"no address for {host}")
        self._dns[(host, port)] = (now + DNS_TTL_S, infos)
        return infos

    async def close(self) -> None:
        self.closed = True
        if self._sweeping is not None:
            self._sweeping.cancel()
            self._sweeping = None
        for idle in self._idle.values():
            for protocol, _ in idle:
                protocol.close()
            idle.clear()
        if self._fallback is not None:
            await self._fallback.close()
