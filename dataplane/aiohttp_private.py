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
- `HeadersWithBody` sets `StreamResponse._send_headers_immediately` off, so a length-delimited
  answer's headers leave with its first body chunk (aiohttp's `Response` does the same).
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.client_proto import ResponseHandler
from aiohttp.helpers import EMPTY_BODY_METHODS, parse_content_type
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_writer import _serialize_headers as serialize_headers

__all__ = ["EMPTY_BODY_METHODS", "HeadersWithBody", "HttpProcessingError", "ResponseHandler",
           "parse_content_type", "serialize_headers", "server_class"]


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
