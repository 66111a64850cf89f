"""Per-account upstream connection pools and the header rules of the hop (SPEC §12, §15).

Pure header helpers return new header lists; the pools hold one `UpstreamClient` (its own
keep-alive connections) per account, created lazily, never decompressing (bodies pass through
with their `Content-Encoding`) and adding no header of their own.
"""

from __future__ import annotations

import asyncio
import collections

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from dataplane.upstream_client import UPSTREAM_TLS, UpstreamClient
from shared.codes import AuthStyle
from shared.settings import Settings
from shared.wire import AccountRoute

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# Never forwarded upstream: the worker's credentials (both headers, always — SPEC §15), the
# OpenAI org/project of the worker's own configuration, and what the client library recomputes.
DROP_UPSTREAM = HOP_BY_HOP | {
    "host",
    "x-api-key",
    "authorization",
    "openai-organization",
    "openai-project",
    "content-length",
}
DROP_DOWNSTREAM = HOP_BY_HOP | {"content-length"}
_X_API_KEY = AuthStyle.X_API_KEY  # bound once: an enum member is a slow class attribute
_SKIP_AUTO = frozenset({"User-Agent", "Accept", "Accept-Encoding", "Content-Type"})
# Distinct upstream URLs kept parsed (paths with query strings vary; the cache is then reset).
URL_CACHE_CAP = 1024


KEEP_MEMO_MAX = 1024  # header names whose verdict a `_Kept` remembers; cleared when full


class _Kept(dict[str, bool]):
    """Header name, as it came → is it kept (its lower case not in `drop`)? A hit is one dict
    lookup instead of `str.lower()`, its hash and a set lookup per header (issue 27: ~25
    headers per request cross the hop twice). Names are the peer's: the memo is bounded."""

    def __init__(self, drop: frozenset[str]) -> None:
        super().__init__()
        self.drop = drop

    def __missing__(self, name: str) -> bool:
        if len(self) >= KEEP_MEMO_MAX:
            self.clear()
        kept = self[name] = name.lower() not in self.drop
        return kept


_KEEP_UPSTREAM = _Kept(DROP_UPSTREAM)


def _listed_in_connection(headers: CIMultiDictProxy[str]) -> set[str]:
    listed: set[str] = set()
    for value in headers.getall("Connection", ()):
        listed.update(token.strip().lower() for token in value.split(",") if token.strip())
    return listed


def _drop_set(headers: CIMultiDictProxy[str], base: frozenset[str]) -> frozenset[str]:
    """`base` plus whatever the `Connection` header names (usually nothing new: `keep-alive`)."""
    if "Connection" not in headers:
        return base
    listed = _listed_in_connection(headers)
    return base if listed <= base else base | listed


def upstream_headers(incoming: CIMultiDictProxy[str], auth_style: str, credential: str) -> CIMultiDict[str]:
    """Every end-to-end header of the worker's request, with the account credential swapped in."""
    drop = _drop_set(incoming, DROP_UPSTREAM)
    if drop is DROP_UPSTREAM:  # the usual request: each name's verdict is remembered
        keep = _KEEP_UPSTREAM
        out: CIMultiDict[str] = CIMultiDict([pair for pair in incoming.items() if keep[pair[0]]])
    else:
        out = CIMultiDict([(n, v) for n, v in incoming.items() if n.lower() not in drop])
    if auth_style == _X_API_KEY:
        out["x-api-key"] = credential
    else:
        out["Authorization"] = "Bearer " + credential
    return out


def downstream_headers(upstream: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """The upstream's response headers minus hop-by-hop ones (Content-Encoding stays), in
    order, an upstream's repeats kept: a copy with the dropped names taken out. Which names
    those are is multidict's case-insensitive `keys() &` (issue 27: a Python test per header
    cost ~1k instructions each, ~17k for an answer with a provider's rate-limit set)."""
    drop = _drop_set(upstream, DROP_DOWNSTREAM)
    headers = CIMultiDict(upstream)
    for name in upstream.keys() & drop:
        headers.popall(name)
    return headers


def upstream_path_qs(rel_url: URL, presented: str) -> str:
    """The worker's path and query string, minus any query parameter carrying its virtual key."""
    if not presented or presented not in rel_url.raw_query_string:
        return rel_url.raw_path_qs
    kept = [(k, v) for k, v in rel_url.query.items() if presented not in v]
    return rel_url.with_query(kept).raw_path_qs


def upstream_url(account: AccountRoute, path_qs: str) -> str:
    """Account base URL + the worker's path and query; a base ending in /v1 is not doubled."""
    base = account.base_url
    if base.endswith("/v1") and path_qs.startswith("/v1/"):
        base = base[:-3]
    return base + path_qs


class PoolTimeout(Exception):
    """No connection slot of the account's pool freed up within the pool timeout."""


class _Gate:
    """At most `size` exchanges of one account in flight; the rest wait, up to a bound."""

    __slots__ = ("size", "in_use", "_waiters")

    def __init__(self, size: int) -> None:
        self.size = size
        self.in_use = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def take(self) -> bool:
        """A slot now if one is free (nobody waits before us); False: `acquire` would wait."""
        if self.in_use < self.size and not self._waiters:
            self.in_use += 1
            return True
        return False

    async def acquire(self, timeout_s: float) -> None:
        if self.in_use < self.size and not self._waiters:
            self.in_use += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout_s):
                await waiter  # release() hands its slot over: in_use already counts it
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a slot just as we gave up: pass it on
            else:
                waiter.cancel()
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
            if isinstance(exc, TimeoutError):
                raise PoolTimeout from None
            raise

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to the waiter
                return
        self.in_use -= 1


class UpstreamPools:
    """One `UpstreamClient` (its own keep-alive connections) and one gate per account, lazily.

    The gate bounds an account's concurrent exchanges at `GATEWAY_UPSTREAM_POOL_SIZE`; a
    request that waits past `GATEWAY_UPSTREAM_POOL_TIMEOUT` for a slot is refused 503
    `pool-timeout` by the proxy (gateway-authored, never evidence). Pools are per account, so
    one account's saturation never delays another's requests.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._clients: dict[str, UpstreamClient] = {}
        self._gates: dict[str, _Gate] = {}
        self._urls: dict[str, URL] = {}

    def client_for(self, account_id: str) -> UpstreamClient:
        client = self._clients.get(account_id)
        if client is None or client.closed:
            client = self._clients[account_id] = UpstreamClient(self.settings.upstream_connect_timeout, self._session)
        return client

    def _session(self) -> aiohttp.ClientSession:
        """An aiohttp session configured like the lean client, for what it hands over."""
        # The gate bounds concurrency; the connector itself is unbounded so the two never
        # disagree about a connection that is closing.
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, ttl_dns_cache=60, ssl=UPSTREAM_TLS)
        timeout = aiohttp.ClientTimeout(
            total=None, connect=None, sock_connect=self.settings.upstream_connect_timeout, sock_read=None
        )
        return aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            auto_decompress=False,
            skip_auto_headers=_SKIP_AUTO,
            read_bufsize=64 * 1024,
            max_field_size=64 * 1024,
            max_line_size=64 * 1024,
        )

    def url_for(self, account: AccountRoute, path_qs: str) -> URL:
        """The upstream URL, parsed once per distinct base and path (most requests share one)."""
        text = upstream_url(account, path_qs)
        url = self._urls.get(text)
        if url is None:
            if len(self._urls) >= URL_CACHE_CAP:
                self._urls.clear()
            url = self._urls[text] = URL(text, encoded=True)
        return url

    def gate_for(self, account_id: str) -> _Gate:
        gate = self._gates.get(account_id)
        if gate is None:
            gate = self._gates[account_id] = _Gate(self.settings.upstream_pool_size)
        return gate

    def in_use(self, account_id: str) -> int:
        gate = self._gates.get(account_id)
        return 0 if gate is None else gate.in_use

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
