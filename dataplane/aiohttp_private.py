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
- The data plane's server builds its connection handler itself (`server_class`), from
  `web.Server`'s `_loop` and `_kwargs`, so aiohttp's own error answers take the wire's shape.
- `BoundedRequestHandler` holds SPEC §19's connection bounds aiohttp has no knob for (the request
  head's deadline, the connection cap) on `RequestHandler`'s `_manager`, `_force_close`,
  `_request_in_progress`, `_messages` and `_loop`.
- `HeadersWithBody` sets `StreamResponse._send_headers_immediately` off, so a length-delimited
  answer's headers leave with its first body chunk (aiohttp's `Response` does the same).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web
from aiohttp.client_proto import ResponseHandler
from aiohttp.helpers import EMPTY_BODY_METHODS, parse_content_type
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_writer import _serialize_headers as serialize_headers

__all__ = [
    "EMPTY_BODY_METHODS",
    "BoundedRequestHandler",
    "ConnectionBounds",
    "HeadersWithBody",
    "HttpProcessingError",
    "ResponseHandler",
    "parse_content_type",
    "serialize_headers",
    "server_class",
]


def server_class(handler: type[web.RequestHandler]) -> type[web.Server]:
    """A `web.Server` whose connections are served by `handler` (a `RequestHandler` subclass),
    built with the arguments aiohttp's own `Server.__call__` passes."""

    class _Server(web.Server):
        def __call__(self) -> web.RequestHandler:
            return handler(self, loop=self._loop, **self._kwargs)

    return _Server


class HeadersWithBody(web.StreamResponse):
    """A length-delimited answer whose headers leave with its first body chunk: a JSON answer
    that arrives whole goes to the worker in one write, instead of headers first and body
    after. Streams (SSE, chunked) keep aiohttp's headers-at-once."""

    _send_headers_immediately = False


class ConnectionBounds:
    """SPEC §19's connection bounds aiohttp has no knob for: the request head's deadline and the
    cap on open connections (the keep-alive bound is aiohttp's `keepalive_timeout`); `answer`
    makes the bytes a connection over the cap is sent before it is closed."""

    __slots__ = ("header_timeout_s", "max_connections", "answer", "open", "refused", "head_timeouts")

    def __init__(self, header_timeout_s: float, max_connections: int, answer: Callable[[], bytes]) -> None:
        self.header_timeout_s = header_timeout_s
        self.max_connections = max_connections
        self.answer = answer
        self.open = 0
        self.refused = 0  # connections answered 503 connection-limit
        self.head_timeouts = 0  # connections closed for a request head not complete in time


class BoundedRequestHandler(web.RequestHandler):
    """aiohttp's connection handler under the server's `bounds` (a `ConnectionBounds` set on the
    `web.Server`): beyond the cap a connection gets `bounds.answer()` and is closed before any
    request is read; a request head not complete `header_timeout_s` after the connection opened,
    or after the first byte of a later head, closes the connection (slowloris).

    The head's clock costs no timer per request (issue 27): a head that begins notes its start
    (`_head_since`) and the parse that completes it clears it; one timer per connection, armed
    only when none is pending, checks at the deadline and re-arms for a head begun since."""

    _bounds: ConnectionBounds | None = None
    _head_timer: asyncio.TimerHandle | None = None
    _head_since: float | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        bounds: ConnectionBounds | None = getattr(self._manager, "bounds", None)
        if bounds is not None and bounds.open >= bounds.max_connections:
            bounds.refused += 1
            self._manager = None  # never counted, never parsed: connection_lost does nothing
            self._force_close = True
            transport.write(bounds.answer())  # type: ignore[attr-defined]
            transport.close()
            return
        super().connection_made(transport)
        if bounds is not None:
            bounds.open += 1
            self._bounds = bounds
            self._head_begins()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._bounds is not None:
            self._bounds.open -= 1
            self._bounds = None
        self._head_since = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._head_since is None and not self._request_in_progress and self._bounds is not None:
            self._head_begins()  # the first byte of a new request head
        _received(self, data)  # aiohttp's own (called directly: no `super()` object per call)
        if self._messages:  # the head is complete: aiohttp handles the request next
            self._head_since = None

    def _head_begins(self) -> None:
        assert self._bounds is not None
        self._head_since = now = self._loop.time()
        if self._head_timer is None:
            self._head_timer = self._loop.call_at(now + self._bounds.header_timeout_s, self._head_check)

    def _head_check(self) -> None:
        self._head_timer = None
        since, bounds = self._head_since, self._bounds
        if since is None or bounds is None or self.transport is None:
            return  # no head pending: the next one arms the timer again
        deadline = since + bounds.header_timeout_s
        if self._loop.time() < deadline - 0.002:  # a later head began: check at its deadline
            self._head_timer = self._loop.call_at(deadline, self._head_check)
            return
        if self._request_in_progress or self._messages:
            return
        bounds.head_timeouts += 1
        self.force_close()
        self.transport.close()


_received = web.RequestHandler.data_received
