"""Per-account upstream connection pools and the header rules of the hop (SPEC §12, §15).

Pure header helpers return new header lists; the pools hold one `ClientSession` per account,
created lazily, never decompressing (bodies pass through with their `Content-Encoding`) and
adding no header of their own.
"""

from __future__ import annotations

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy

from shared.codes import AuthStyle
from shared.settings import Settings
from shared.wire import AccountRoute

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade",
})
# Never forwarded upstream: the worker's credentials (both headers, always — SPEC §15), the
# OpenAI org/project of the worker's own configuration, and what the client library recomputes.
DROP_UPSTREAM = HOP_BY_HOP | {
    "host", "x-api-key", "authorization", "openai-organization", "openai-project",
    "content-length",
}
DROP_DOWNSTREAM = HOP_BY_HOP | {"content-length"}
_SKIP_AUTO = frozenset({"User-Agent", "Accept", "Accept-Encoding", "Content-Type"})


def _listed_in_connection(headers: CIMultiDictProxy[str]) -> set[str]:
    listed: set[str] = set()
    for value in headers.getall("Connection", ()):
        listed.update(token.strip().lower() for token in value.split(",") if token.strip())
    return listed


def upstream_headers(incoming: CIMultiDictProxy[str], auth_style: str, credential: str) -> CIMultiDict[str]:
    """Every end-to-end header of the worker's request, with the account credential swapped in."""
    drop = DROP_UPSTREAM | _listed_in_connection(incoming)
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in incoming.items():
        if name.lower() not in drop:
            out.add(name, value)
    if auth_style == AuthStyle.X_API_KEY:
        out["x-api-key"] = credential
    else:
        out["Authorization"] = "Bearer " + credential
    return out


def downstream_headers(upstream: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """The upstream's response headers minus hop-by-hop ones (Content-Encoding stays)."""
    drop = DROP_DOWNSTREAM | _listed_in_connection(upstream)
    return CIMultiDict((k, v) for k, v in upstream.items() if k.lower() not in drop)


def upstream_url(account: AccountRoute, path_qs: str) -> str:
    """Account base URL + the worker's path and query; a base ending in /v1 is not doubled."""
    base = account.base_url
    if base.endswith("/v1") and path_qs.startswith("/v1/"):
        base = base[:-3]
    return base + path_qs


class UpstreamPools:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._sessions: dict[str, aiohttp.ClientSession] = {}

    def session_for(self, account_id: str) -> aiohttp.ClientSession:
        session = self._sessions.get(account_id)
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, ttl_dns_cache=60)
            timeout = aiohttp.ClientTimeout(total=None, connect=None,
                                            sock_connect=self.settings.upstream_connect_timeout,
                                            sock_read=None)
            session = aiohttp.ClientSession(
                connector=connector, timeout=timeout, auto_decompress=False,
                skip_auto_headers=_SKIP_AUTO, read_bufsize=64 * 1024,
                max_field_size=64 * 1024, max_line_size=64 * 1024,
            )
            self._sessions[account_id] = session
        return session

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()
