"""One request: its head as parsed, its body as it arrives, and per-request storage.

The body is read only when the handler asks (`read`): the auth middleware runs first, so an
unauthenticated caller's body is never read (SPEC §13), and `Expect: 100-continue` is answered
only at that first read. Bytes buffered ahead of the read are bounded (`Limits.body_buffer_bytes`:
past it the connection stops reading); the whole body by the app's `client_max_size` (413, the
declared Content-Length refused before anything is read); a read waiting longer than
`Limits.body_timeout_s` for the next bytes ends in a 408 and a closed connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast
from urllib.parse import parse_qsl, unquote

from httptools import parse_url

from shared.http1.errors import BodyIncomplete, HTTPRequestEntityTooLarge, HTTPRequestTimeout
from shared.http1.headers import Headers, content_type_of

if TYPE_CHECKING:
    from shared.http1.router import MatchInfo
    from shared.http1.state import State

T = TypeVar("T")


class Flow(Protocol):
    """What a body needs of its connection."""

    def pause_reading(self, why: str) -> None: ...
    def resume_reading(self, why: str) -> None: ...
    def send_continue(self) -> None: ...


class Body:
    """A request body as llhttp hands it over (chunked framing already decoded)."""

    __slots__ = (
        "flow",
        "limit_s",
        "buffer_bytes",
        "expects_continue",
        "declared",
        "_chunks",
        "_buffered",
        "complete",
        "consumed",
        "failed",
        "discarding",
        "discarded",
        "_waiter",
    )

    def __init__(self, flow: Flow, declared: int | None, expects_continue: bool, limit_s: float, buffer_bytes: int):
        self.flow, self.limit_s, self.buffer_bytes = flow, limit_s, buffer_bytes
        self.declared = declared  # Content-Length, None when chunked or absent
        self.expects_continue = expects_continue
        self._chunks: list[bytes] = []
        self._buffered = 0
        self.complete = False  # llhttp saw the message end
        self.consumed = False  # the handler read it all
        self.failed: BaseException | None = None
        self.discarding = False
        self.discarded = 0
        self._waiter: asyncio.Future[None] | None = None

    # ---- the connection's side
    def feed(self, chunk: bytes) -> None:
        if self.discarding:
            self.discarded += len(chunk)
            return
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        if self._buffered > self.buffer_bytes:
            self.flow.pause_reading("body")
        if self._waiter is not None:  # (a reader waits: no call per chunk otherwise)
            self._wake()

    def finish(self) -> None:
        self.complete = True
        if self._waiter is not None:
            self._wake()

    def fail(self, exc: BaseException) -> None:
        if not self.complete:
            self.failed = exc
            self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def take(self) -> list[bytes]:
        """What arrived and was not read yet (the handed-off connection's)."""
        chunks, self._chunks, self._buffered = self._chunks, [], 0
        return chunks

    # ---- the handler's side
    async def read_all(self, max_size: int) -> bytes:
        if max_size and self.declared is not None and self.declared > max_size:
            raise HTTPRequestEntityTooLarge(max_size)  # refused before any byte is read
        if self.expects_continue and not self.complete and not self._chunks:
            self.expects_continue = False
            self.flow.send_continue()
        body = bytearray()
        while True:
            self.flow.resume_reading("body")  # bytes held back may land in `_chunks` now
            if self.complete and not body:  # all of it arrived before this read: no copy to gather
                whole = b"".join(self._chunks)  # (one chunk: that chunk itself)
                self._chunks.clear()
                self._buffered = 0
                if max_size and len(whole) > max_size:
                    raise HTTPRequestEntityTooLarge(max_size)
                self.consumed = True
                return whole
            body += b"".join(self._chunks)
            self._chunks.clear()
            self._buffered = 0
            if max_size and len(body) > max_size:
                raise HTTPRequestEntityTooLarge(max_size)
            if self.complete:
                self.consumed = True
                return bytes(body)
            if self.failed is not None:
                raise BodyIncomplete(str(self.failed))
            await self._next()

    async def _next(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(self._waiter, self.limit_s)
        except TimeoutError:
            raise HTTPRequestTimeout(text="the request body stalled") from None
        finally:
            self._waiter = None

    async def discard(self, deadline_s: float, max_bytes: int) -> bool:
        """Drop what is left of a body the handler did not read; True once the message ended
        within `deadline_s` and `max_bytes` (the connection can then carry the next request)."""
        self.discarding = True
        self._chunks.clear()
        self._buffered = 0
        self.flow.resume_reading("body")
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline_s
        while not self.complete and self.failed is None and self.discarded <= max_bytes:
            self._waiter = loop.create_future()
            try:
                await asyncio.wait_for(self._waiter, max(0.0, end - loop.time()))
            except TimeoutError:
                return False
            finally:
                self._waiter = None
        return self.complete and self.discarded <= max_bytes


class Request:
    """What a handler sees: aiohttp's `web.Request` surface that control's handlers use."""

    __slots__ = (
        "app",
        "method",
        "version",
        "target",
        "raw_path",
        "path",
        "segments",
        "query_string",
        "headers",
        "body",
        "keep_alive",
        "match_info",
        "_conn",
        "_query",
        "_storage",
        "_read",
        "_max_body",
        "started",
    )

    match_info: MatchInfo  # set by the app's router before any handler runs

    def __init__(
        self,
        method: str,
        version: tuple[int, int],
        target: bytes,
        headers: Headers,
        body: Body,
        keep_alive: bool,
        conn: Any,
        app: State,
        max_body: int,
    ) -> None:
        self.method, self.version, self.headers, self.body = method, version, headers, body
        self.keep_alive = keep_alive
        self.target = target  # the request line's target, as sent
        if not target.startswith(b"/") and b"://" in target:  # absolute-form: its path and query
            parsed = parse_url(target)
            target = (parsed.path or b"/") + (b"?" + parsed.query if parsed.query else b"")
        raw = target.decode("latin-1")
        self.raw_path, _, self.query_string = raw.partition("#")[0].partition("?")
        raw_segments = self.raw_path.split("/")
        if "%" in self.raw_path:
            self.segments = tuple(unquote(s) for s in raw_segments)
            self.path = "/".join(self.segments)
        else:  # nothing to decode
            self.segments, self.path = tuple(raw_segments), self.raw_path
        self._conn = conn
        self._query: dict[str, str] | None = None
        self._storage: dict[Any, Any] = {}
        self._read: bytes | None = None
        self.app = app
        self._max_body = max_body
        self.started = False  # a response's head went out: nothing else may answer this request

    @property
    def query(self) -> dict[str, str]:
        """The query's first value per name ('+' is a space, bad escapes kept, bad UTF-8 replaced)."""
        if self._query is None:
            self._query = {}
            for name, value in parse_qsl(self.query_string, keep_blank_values=True, errors="replace"):
                self._query.setdefault(name, value)
        return self._query

    @property
    def transport(self) -> asyncio.Transport | None:
        return cast("asyncio.Transport | None", self._conn.transport)

    @property
    def peer_gone(self) -> bool:
        """The peer closed, or ended its side (EOF): a long answer (a feed) has no one to read it.
        A short answer is still written after a half-close; a stream stops (as aiohttp closed on EOF)."""
        conn = self._conn
        return conn.transport is None or conn.transport.is_closing() or conn.peer_ended

    @property
    def remote(self) -> str | None:
        return cast("str | None", self._conn.remote)

    @property
    def can_read_body(self) -> bool:
        has_body = self.body.declared != 0 and (self.body.declared is not None or "Transfer-Encoding" in self.headers)
        return has_body and not self.body.consumed

    @property
    def content_length(self) -> int | None:
        """The declared Content-Length (None when chunked or absent)."""
        return self.body.declared

    @property
    def path_qs(self) -> str:
        """The raw path and query, as the request line carried them (aiohttp's `rel_url.raw_path_qs`)."""
        return self.raw_path + "?" + self.query_string if self.query_string else self.raw_path

    def head_bytes(self) -> bytes:
        """The head re-serialised as it arrived: request line and headers in their order."""
        lines = [f"{self.method} {self.target.decode('latin-1')} HTTP/{self.version[0]}.{self.version[1]}"]
        lines += [f"{name}: {value}" for name, value in self.headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")

    @property
    def content_type(self) -> str:
        return content_type_of(self.headers.get("Content-Type"))

    async def read(self) -> bytes:
        if self._read is None:
            self._read = await self.body.read_all(self._max_body)
        return self._read

    def get(self, key: Any, default: T | None = None) -> Any:
        return self._storage.get(key, default)

    def __getitem__(self, key: Any) -> Any:
        return self._storage[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._storage[key] = value

    def __contains__(self, key: Any) -> bool:
        return key in self._storage


Handler = Callable[[Request], Any]
