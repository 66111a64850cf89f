"""The upstream socket: the account's base URL as `ws`/`wss`, the account's credential, and the
client's handshake headers less hop-by-hop, the worker's credentials and the handshake's own
(`sec-websocket-*`, which aiohttp computes for its side). permessage-deflate is negotiated per
side (SPEC §20): offered to the upstream when the worker offered it to us, each side settling
its own parameters (so a worker that wants no compression costs no inflate per message).

An upstream that refuses the handshake with a status is answered with that status, its
headers and body, as HTTP (`HandshakeRefused`); aiohttp drops a refused handshake's body, so a
response class keeps it (bounded) for the task that asked (`_refusal`). The same class hands an
accepted handshake's headers (the 101's) to the task that asked (`_accepted`), for the
provider's rate limits they carry (SPEC §22).
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy

from dataplane.upstream_client import UPSTREAM_TLS
from dataplane.upstreams import upstream_headers, upstream_url
from shared.settings import Settings
from shared.wire import AccountRoute

# A refused handshake's body is kept up to this size (an error answer is a few hundred bytes).
REFUSAL_BODY_CAP = 64 * 1024
CLOSE_TIMEOUT_S = 5.0
_refusal: contextvars.ContextVar[list[bytes] | None] = contextvars.ContextVar("ws_refusal", default=None)
_accepted: contextvars.ContextVar[list[CIMultiDictProxy[str]] | None] = contextvars.ContextVar(
    "ws_accepted", default=None
)


class HandshakeRefused(Exception):
    def __init__(self, status: int, headers: CIMultiDictProxy[str], body: bytes) -> None:
        super().__init__(status)
        self.status = status
        self.headers = headers
        self.body = body


class _KeepRefusal(aiohttp.ClientResponse):
    async def start(self, connection: Any) -> aiohttp.ClientResponse:
        await super().start(connection)
        if self.status == 101:
            seen = _accepted.get()
            if seen is not None:
                seen.append(self.headers)
        box = _refusal.get()
        if self.status != 101 and box is not None:
            try:
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    while sum(map(len, box)) < REFUSAL_BODY_CAP:
                        chunk = await self.content.read(REFUSAL_BODY_CAP)
                        if not chunk:
                            break
                        box.append(chunk)
            except (TimeoutError, aiohttp.ClientError, OSError):
                pass
        return self


def ws_url(account: AccountRoute, path_qs: str) -> str:
    url = upstream_url(account, path_qs)
    if url.startswith("https://"):
        return "wss://" + url[8:]
    if url.startswith("http://"):
        return "ws://" + url[7:]
    return url


def handshake_headers(
    incoming: CIMultiDictProxy[str], auth_style: str, credential: str
) -> tuple[CIMultiDict[str], tuple[str, ...]]:
    """The headers for the upstream handshake, and the subprotocols the worker offered."""
    out = upstream_headers(incoming, auth_style, credential)
    for name in [n for n in out if n.lower().startswith("sec-websocket-")]:
        out.popall(name, None)
    offered = ",".join(incoming.getall("Sec-WebSocket-Protocol", ()))
    return out, tuple(p.strip() for p in offered.split(",") if p.strip())


def _offers_deflate(incoming: CIMultiDictProxy[str]) -> bool:
    return any("permessage-deflate" in v.lower() for v in incoming.getall("Sec-WebSocket-Extensions", ()))


class UpstreamSockets:
    """One aiohttp client session for every upstream socket (each socket is its own connection)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            s = self.settings
            timeout = aiohttp.ClientTimeout(
                total=None, connect=s.upstream_connect_timeout, sock_read=s.upstream_headers_timeout
            )
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=True, ssl=UPSTREAM_TLS),
                timeout=timeout,
                response_class=_KeepRefusal,
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
            )
        return self._session

    async def connect(
        self,
        account: AccountRoute,
        path_qs: str,
        incoming: CIMultiDictProxy[str],
        credential: str,
        max_msg_size: int,
        accepted: list[CIMultiDictProxy[str]] | None = None,
    ) -> aiohttp.ClientWebSocketResponse:
        """The upstream socket, or `HandshakeRefused` / aiohttp's errors; the 101's headers are
        appended to `accepted` when given."""
        headers, protocols = handshake_headers(incoming, account.auth_style, credential)
        box: list[bytes] = []
        token = _refusal.set(box)
        seen = _accepted.set(accepted)
        try:
            return await self.session().ws_connect(
                ws_url(account, path_qs),
                headers=headers,
                protocols=protocols,
                autoping=False,
                autoclose=False,
                compress=15 if _offers_deflate(incoming) else 0,
                max_msg_size=max_msg_size,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=CLOSE_TIMEOUT_S),
            )
        except aiohttp.WSServerHandshakeError as exc:
            if exc.status == 101:  # upgraded, but not as a WebSocket: the upstream is broken
                raise
            raise HandshakeRefused(
                exc.status, CIMultiDictProxy(CIMultiDict(exc.headers or {})), b"".join(box)
            ) from None
        finally:
            _refusal.reset(token)
            _accepted.reset(seen)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
