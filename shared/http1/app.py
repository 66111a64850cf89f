"""The application: routes, middlewares, typed state (`AppKey`), and the lifecycle hooks
control's modules use (`cleanup_ctx`: a loop while the app runs; `on_shutdown`: before the
connections close). `handle` runs one request through the middlewares to its route and turns
what escapes into an answer: an `HTTPException` into its plain-text response, anything else
into aiohttp's 500 (and a closed connection)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from shared.http1.errors import (
    BodyIncomplete,
    HTTPException,
    HTTPRequestEntityTooLarge,
    HTTPRequestTimeout,
    Refusal,
    Refused,
)
from shared.http1.request import Request
from shared.http1.response import Response, StreamResponse, text_response
from shared.http1.router import Router
from shared.http1.state import State
from shared.logging import get_logger

log = get_logger("http1")

T = TypeVar("T")
DEFAULT_BODY_LIMIT = 1024 * 1024  # aiohttp's client_max_size


def middleware(func: T) -> T:
    """aiohttp's decorator; a middleware here is any `async (request, handler) -> response`."""
    return func


CleanupCtx = Callable[["Application"], AsyncIterator[None]]


class Application(State):
    def __init__(self, *, middlewares: list[Any] | tuple[Any, ...] = (), client_max_size: int = DEFAULT_BODY_LIMIT):
        super().__init__()
        self.middlewares = list(middlewares)
        self.client_max_size = client_max_size
        self.router = Router()
        self.cleanup_ctx: list[CleanupCtx] = []
        self.on_shutdown: list[Callable[[Application], Awaitable[None]]] = []
        self._exits: contextlib.AsyncExitStack | None = None

    # ---- lifecycle
    async def startup(self) -> None:
        self._exits = contextlib.AsyncExitStack()
        for ctx in self.cleanup_ctx:
            await self._exits.enter_async_context(contextlib.asynccontextmanager(ctx)(self))

    async def shutdown(self) -> None:
        for callback in self.on_shutdown:
            await callback(self)

    async def cleanup(self) -> None:
        if self._exits is not None:
            exits, self._exits = self._exits, None
            await exits.aclose()

    # ---- what the connection answers itself
    def refusal_answer(self, refusal: Refusal) -> StreamResponse | None:
        """The answer to bytes the server refused (sent, then the connection closes); None: no
        answer, only the close."""
        return text_response(refusal.status, refusal.text, {"Content-Type": "text/plain; charset=utf-8"})

    # ---- one request
    async def handle(self, request: Request) -> tuple[StreamResponse, Refused | None]:
        request.match_info = self.router.resolve(request.method, request.segments)
        handler = request.match_info.route.handler
        for outer in reversed(self.middlewares):
            handler = partial(outer, handler=handler)
        try:
            response = await handler(request)
            if not isinstance(response, StreamResponse):
                raise TypeError(f"the handler returned {type(response).__name__}, not a response")
        except HTTPException as exc:
            answer = text_response(exc.status, exc.text, exc.headers)
            if isinstance(exc, HTTPRequestTimeout):  # a stalled body: the connection is done
                answer.force_close()
                return answer, Refused.BODY_TIMEOUT
            return answer, Refused.BODY_TOO_LARGE if isinstance(exc, HTTPRequestEntityTooLarge) else None
        except BodyIncomplete as exc:  # the peer closed, or broke the framing, mid-body
            answer = text_response(400, f"400: Bad Request ({exc})", {"Content-Type": "text/plain; charset=utf-8"})
            answer.force_close()
            return answer, Refused.BAD_REQUEST
        except Exception:
            log.exception("http_handler_failed", method=request.method, path=request.path)
            failed = Response(text="500 Internal Server Error\n\nServer got itself in trouble", status=500)
            failed.force_close()
            return failed, Refused.HANDLER_FAILED
        return response, None
