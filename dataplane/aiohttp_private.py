"""The one module that touches aiohttp's private parts; everything else uses its public API.

None of these is public API, so setup.cfg pins the aiohttp minors they were checked on and
tests/unit/test_aiohttp_private_api.py drives each one the way the data plane does: it is the
first thing to fail when a new aiohttp moves them. tests/unit/test_aiohttp_private_api.py also
fails when a module other than this one imports an aiohttp internal or reaches for one of the
private attributes below.

- The upstream client (`dataplane/upstream_client.py`) writes a request head with
  `serialize_headers` (`aiohttp.http_writer._serialize_headers`) and reads the answer with
  `ResponseHandler` (`aiohttp.client_proto`), plus `EMPTY_BODY_METHODS` and
  `parse_content_type` (`aiohttp.helpers`) and `HttpProcessingError` (`aiohttp.http_exceptions`).
  `KeptAlive`, its `ResponseHandler`, keeps the response parser (`_parser`, aiohttp's C
  `HttpResponseParser`) from one exchange to the next on a kept-alive connection, as long as
  the parser stands between two messages (its `feed_eof()` answers None only there): issue 27.
- The data plane's WebSocket (SPEC §20) is served by aiohttp on a connection `shared.http1`
  parsed the handshake's head of (`hand_over`): a `web.Server`'s connection handler, built as
  aiohttp's `Server.__call__` builds it (from `_loop` and `_kwargs`: `server_class`), is given the
  transport, then the head again and what followed it; `HandedOver` reports its close back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.client_proto import ResponseHandler
from aiohttp.helpers import EMPTY_BODY_METHODS, parse_content_type
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_writer import _serialize_headers as serialize_headers

__all__ = [
    "EMPTY_BODY_METHODS",
    "HandedOver",
    "HttpProcessingError",
    "KeptAlive",
    "ResponseHandler",
    "hand_over",
    "handed_over_server",
    "parse_content_type",
    "serialize_headers",
    "server_class",
]


# The response parser's settings for every exchange (aiohttp's, as its session sets them), but
# `skip_payload` (a HEAD's answer has no body): `KeptAlive.expect_response`.
RESPONSE_PARAMS: dict[str, Any] = dict(
    read_until_eof=True,
    auto_decompress=False,
    read_bufsize=64 * 1024,
    timeout_ceil_threshold=5,
    max_line_size=64 * 1024,
    max_field_size=64 * 1024,
    max_headers=128,
)


class KeptAlive(ResponseHandler):
    """aiohttp's `ResponseHandler`, its response parser kept for the connection's next exchange.

    `set_response_params` builds a new C parser per exchange (~10k instructions: issue 27);
    aiohttp's parser reads consecutive answers itself. It is kept only when a fresh one would
    read the next answer exactly alike: built with the same settings (`parser_skips`), the
    connection clean (`should_close` false: the last answer read to its end, nothing queued or
    failed), and the parser between two messages. A parser that has taken bytes of a next
    message (an upstream writing past its answer) answers `feed_eof()` with that message, or
    raises; only a parser between messages (CR/LF aside, which a fresh one skips too) answers
    None, without touching anything. Any other answer: a fresh parser, as before, and the one
    probed is dropped. tests/unit/test_aiohttp_private_api.py holds each of these."""

    parser_skips: bool | None = None  # `skip_payload` of the parser set, None before the first

    def expect_response(self, skip_payload: bool) -> None:
        """The parser for the next exchange's answer: the kept one or a fresh one."""
        parser = self._parser
        if parser is not None and self.parser_skips is skip_payload and not self.should_close:
            try:
                between = parser.feed_eof() is None
            except Exception:  # (a partial next message it cannot finish)
                between = False
            if between:
                return
        self.set_response_params(skip_payload=skip_payload, **RESPONSE_PARAMS)
        self.parser_skips = skip_payload


def server_class(handler: type[web.RequestHandler]) -> type[web.Server]:
    """A `web.Server` whose connections are served by `handler` (a `RequestHandler` subclass),
    built with the arguments aiohttp's own `Server.__call__` passes."""

    class _Server(web.Server):
        def __call__(self) -> web.RequestHandler:
            return handler(self, loop=self._loop, **self._kwargs)

    return _Server


class HandedOver(web.RequestHandler):
    """aiohttp's connection handler on a connection another protocol accepted and handed over;
    `lost` (that protocol's `connection_lost`) hears of the close, so the connection is counted
    where it was accepted until then."""

    lost: Callable[[Exception | None], None] | None = None

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        lost, self.lost = self.lost, None
        if lost is not None:
            lost(exc if isinstance(exc, Exception) else None)


Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


def handed_over_server(handle: Handler, max_body_bytes: int, max_line_bytes: int) -> web.Server:
    """The `web.Server` handed-over connections are served by: `handle` for each request, the
    handler cancelled when the peer goes, bodies undecoded."""
    loop = asyncio.get_running_loop()

    def request_factory(
        message: Any, payload: Any, protocol: Any, writer: Any, task: asyncio.Task[None]
    ) -> web.BaseRequest:
        return web.BaseRequest(message, payload, protocol, writer, task, loop, client_max_size=max_body_bytes)

    return server_class(HandedOver)(
        handle,
        request_factory=request_factory,
        handler_cancellation=True,
        access_log=None,
        auto_decompress=False,
        max_field_size=max_line_bytes,
        max_line_size=max_line_bytes,
    )


def hand_over(
    server: web.Server, transport: asyncio.Transport, data: bytes, lost: Callable[[Exception | None], None]
) -> None:
    """`transport` (reading paused) to a new connection handler of `server`, which reads `data`
    (the head again, and what followed it) first; `lost` is called when the connection closes."""
    handler = server()
    assert isinstance(handler, HandedOver)
    handler.lost = lost
    transport.set_protocol(handler)
    handler.connection_made(transport)
    if data:
        handler.data_received(data)
    transport.resume_reading()
