"""One connection: bytes in through llhttp (`httptools.HttpRequestParser`), requests answered
in the order they arrived, one at a time (pipelining), the connection kept alive or closed.

Every bound is checked where the bytes are: the request line as it arrives (`on_url`), each
header as it completes, the whole head in slices of `HEAD_SLICE` bytes (httptools buffers a
header until it ends, so the slice bounds what it holds past the limit), the time from a head's
first byte to its end, and how many parsed requests wait (reading pauses past
`Limits.max_pipelined`; the unparsed rest is held until the queue drains). What the parser
refuses (llhttp's strict mode: bad framing, both Content-Length and Transfer-Encoding, bare LF,
a bad chunk) is answered (`Application.refusal_answer`) after the requests before it, and the
connection closes; each refusal is counted (`Server.refused`) and the server goes on.

The data plane's options (`host.Host`): `handler_cancellation` (aiohttp's: an EOF is a close,
which cancels the request being answered); `hand_off` (an `Upgrade: websocket` request, its
transport and the bytes after its head, to another protocol; counted until it reports the
close); `Limits.max_connections` (one past the cap is sent `over_cap()` and closed unread).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

from httptools import HttpParserError, HttpParserUpgrade, HttpRequestParser

from shared.http1.answer import answer_one, answer_refusal, is_websocket
from shared.http1.errors import BodyIncomplete, Refusal, Refused, parser_reason
from shared.http1.headers import Headers
from shared.http1.request import Body, Request
from shared.logging import get_logger

if TYPE_CHECKING:
    from shared.http1.host import Host

log = get_logger("http1")

HEAD_SLICE = 8192  # bytes fed at a time while a head is being parsed
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Connection(asyncio.Protocol):
    def __init__(self, server: Host) -> None:
        self.server, self.app, self.limits = server, server.app, server.limits
        self.transport: asyncio.Transport | None = None
        self.remote: str | None = None
        self._parser = HttpRequestParser(self)
        self._queue: deque[Request | Refusal] = deque()
        self._incoming: Request | None = None  # the request whose body is arriving
        self._task: asyncio.Task[None] | None = None
        self._paused: set[str] = set()
        self._held = b""  # unparsed bytes held while too many requests wait
        self._loop = asyncio.get_running_loop()
        self._head_timer: asyncio.TimerHandle | None = None  # armed only when a head spans reads
        self._head_began = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None  # re-armed lazily, not per request
        self._idle_since = self._loop.time()
        self._drain: asyncio.Future[None] | None = None
        self._stopped = False  # nothing more is read: refused, upgraded, or shutting down
        self._eof = False  # the peer half-closed: what it sent is answered, then the close
        self._in_head = False
        self._url = bytearray()
        self._headers: list[tuple[str, str]] = []
        self._first: dict[str, str] = {}  # each lower-cased name's first value
        self._head_bytes = 0
        self._head_size = 0
        self._upgrade_tail: bytes | None = None  # what followed an upgrade request's head
        self.handed_off = False  # the transport belongs to another protocol now
        self._first_pending = False  # the first head's clock runs from the opening (`head_from_open`)

    # ---- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server, limits = self.server, self.limits
        if limits.max_connections and len(server.connections) >= limits.max_connections:
            server.refused[Refused.CONNECTION_LIMIT] += 1
            self._stopped = True  # never counted, never parsed
            if server.over_cap is not None:
                transport.write(server.over_cap())  # type: ignore[attr-defined]
            transport.close()
            return
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.remote = peer[0] if isinstance(peer, tuple) else None
        server.connections.add(self)
        if limits.head_from_open:
            self._first_pending = self._in_head = True
            self._head_began = self._loop.time()
            self._head_timer = self._loop.call_at(self._head_began + limits.head_timeout_s, self._head_timeout)
        else:
            self._went_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:  # refused over the cap: never counted
            return
        self.transport = None
        self._disarm()
        self._stopped = True
        if self.server.handler_cancellation and self._task is not None and not self.handed_off:
            self._task.cancel()  # the request being answered ends with its peer
        gone = BodyIncomplete("the peer closed the connection")
        for item in (self._incoming, *self._queue):
            if isinstance(item, Request):
                item.body.fail(gone)
        self._queue.clear()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)  # a writer waiting finds the transport gone
        self.server.forget(self)

    def data_received(self, data: bytes) -> None:
        if self._stopped:
            return
        if self._held or "pipeline" in self._paused:
            self._held += data
            return
        self._feed(data)

    def eof_received(self) -> bool:
        """The peer sent all it will (a half-close): what it asked is still answered, then the
        connection closes; a body still owed never comes. Under `handler_cancellation` an EOF is
        the peer's close (as aiohttp takes it)."""
        if self.server.handler_cancellation:
            return False
        self._eof = True
        self._disarm()
        if self._incoming is not None:
            self._incoming.body.fail(BodyIncomplete("the peer ended its side mid-body"))
            self._incoming = None
        self._in_head = self._first_pending = False  # a head cut short never completes
        return not self._idle() or bool(self._held)

    @property
    def reading_stopped(self) -> bool:
        return self._stopped

    @property
    def peer_ended(self) -> bool:
        """The peer sent EOF (closed, or half-closed its side)."""
        return self._eof

    def pause_writing(self) -> None:
        if self._drain is None or self._drain.done():
            self._drain = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # ---- parsing
    def _feed(self, data: bytes) -> None:
        self._parse(data)
        if self._in_head and self._head_timer is None and not self._stopped:  # a head spanning reads
            self._head_timer = self._loop.call_at(self._head_began + self.limits.head_timeout_s, self._head_timeout)

    def _parse(self, data: bytes) -> None:
        pos = 0
        while pos < len(data) and not self._stopped:
            if "pipeline" in self._paused:
                self._held = data[pos:]
                return
            in_body = self._incoming is not None and not self._in_head
            piece = data[pos:] if in_body else data[pos : pos + HEAD_SLICE]
            pos += len(piece)
            try:
                self._parser.feed_data(piece)
            except HttpParserUpgrade as upgrade:
                self._upgrade_tail = piece[upgrade.args[0] :] + data[pos:]
                self._stop_reading()  # the upgrade request is queued; nothing after it is HTTP
                return
            except HttpParserError as exc:
                cause = exc.__context__
                self._refuse(cause if isinstance(cause, Refusal) else Refusal(Refused.BAD_REQUEST, parser_reason(exc)))
                return
            if self._in_head:
                self._head_bytes += len(piece)
                if self._head_bytes > self.limits.max_head_bytes:
                    self._refuse(Refusal(Refused.HEAD_TOO_LARGE, "Request header fields too large"))
                    return

    def on_message_begin(self) -> None:
        self._in_head = True
        self._head_bytes = 0  # bytes fed while in this head: bounds what httptools buffers
        self._head_size = 0  # the head's parts as they complete: its size, exactly
        self._url.clear()
        self._headers = []
        self._first = {}
        if not self._first_pending:  # (the first head's clock started with the connection)
            self._head_began = self._loop.time()
        self._first_pending = False

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_size += len(url)
        if len(self._url) > self.limits.max_line_bytes:
            raise Refusal(Refused.LINE_TOO_LONG, f"Got more than {self.limits.max_line_bytes} bytes when reading")

    def on_header(self, name: bytes, value: bytes) -> None:
        limits, headers = self.limits, self._headers
        size = len(name) + len(value)
        if size > limits.max_field_bytes and max(len(name), len(value)) > limits.max_field_bytes:
            raise Refusal(Refused.FIELD_TOO_LONG, f"Got more than {limits.max_field_bytes} bytes when reading")
        if len(headers) >= limits.max_headers:
            raise Refusal(Refused.TOO_MANY_HEADERS, "Too many headers received")
        self._head_size += size + 4
        if self._head_size > limits.max_head_bytes:
            raise Refusal(Refused.HEAD_TOO_LARGE, "Request header fields too large")
        key, text = name.decode("latin-1"), value.decode("utf-8", "surrogateescape")
        headers.append((key, text))
        self._first.setdefault(key.lower(), text)

    def on_headers_complete(self) -> None:
        self._in_head = self._first_pending = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        first, headers = self._first, Headers(self._headers, self._first)  # (lower-cased names)
        version = (1, 1) if self._parser.get_http_version() == "1.1" else (1, 0)
        length = first.get("content-length")
        expect = first.get("expect")
        body = Body(  # (by position: keywords cost ~450 instructions each on 3.11)
            self,
            None if length is None or "transfer-encoding" in first else int(length),  # declared
            expect is not None and version >= (1, 1) and expect.lower() == "100-continue",  # expects_continue
            self.limits.body_timeout_s,  # limit_s
            self.limits.body_buffer_bytes,  # buffer_bytes
        )
        request = Request(
            self._parser.get_method().decode("ascii"),  # method
            version,
            bytes(self._url),  # target
            headers,
            body,
            self._parser.should_keep_alive(),  # keep_alive
            self,  # conn
            self.app,
            self.app.client_max_size,  # max_body
        )
        self._incoming = request
        self._queue.append(request)
        if len(self._queue) > self.limits.max_pipelined:
            self.pause_reading("pipeline")
        self._kick()

    def on_body(self, body: bytes) -> None:
        if self._incoming is not None:
            self._incoming.body.feed(body)

    def on_message_complete(self) -> None:
        if self._incoming is not None:
            self._incoming.body.finish()
            self._incoming = None

    # ---- refusals and deadlines
    def _refuse(self, refusal: Refusal) -> None:
        self.server.refused[refusal.reason] += 1
        log.info("http_request_refused", reason=str(refusal.reason), peer=self.remote)
        self._stop_reading()
        if self._incoming is not None:  # mid-body: its handler's read fails; then the close
            self._incoming.body.fail(refusal)
            self._incoming = None
            return
        self._in_head = False
        self._queue.append(refusal)
        self._kick()

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self._in_head:
            self._refuse(Refusal(Refused.HEAD_TIMEOUT, "the request head did not arrive in time", 408))

    def _went_idle(self) -> None:
        self._idle_since = self._loop.time()
        if self._idle_timer is None:
            self._idle_timer = self._loop.call_at(self._idle_since + self.limits.keepalive_s, self._idle_timeout)

    def _idle_timeout(self) -> None:
        """Idle since `_idle_since` for the whole deadline: closed. Busy now: the next idle
        period arms it again. Idle, but not for long enough: armed for the rest."""
        self._idle_timer = None
        if not self._idle():
            return
        due = self._idle_since + self.limits.keepalive_s
        if self._loop.time() >= due:
            self.close()
        else:
            self._idle_timer = self._loop.call_at(due, self._idle_timeout)

    def _disarm(self) -> None:
        for timer in (self._head_timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._idle_timer = None

    def _idle(self) -> bool:
        head = self._in_head and not self._first_pending  # (a connection yet to send: idle)
        return self._task is None and not self._queue and self._incoming is None and not head

    # ---- flow control (a body's `Flow`)
    def pause_reading(self, why: str) -> None:
        if not self._paused and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self._paused.add(why)

    def resume_reading(self, why: str) -> None:
        if why not in self._paused:
            return
        self._paused.discard(why)
        if self._paused or self._stopped or self.transport is None:
            return
        held, self._held = self._held, b""
        if held:
            self._feed(held)
        if not self._paused and not self._stopped and not self._eof and self.transport is not None:
            self.transport.resume_reading()

    def send_continue(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(CONTINUE)

    def _stop_reading(self) -> None:
        self._stopped = True
        self._disarm()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    # ---- answering
    async def write(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("Cannot write to closing transport")
        self.transport.write(data)
        if self._drain is not None and not self._drain.done():
            await self._drain
            if self.transport is None:
                raise ConnectionResetError("the peer closed the connection")

    def _kick(self) -> None:
        if self._task is None and self._queue and self.transport is not None:
            self._task = self._loop.create_task(self._serve())

    async def _serve(self) -> None:
        keep = True
        try:
            while keep and self._queue and self.transport is not None:
                item = self._queue.popleft()
                if "pipeline" in self._paused and len(self._queue) <= self.limits.max_pipelined // 2:
                    self.resume_reading("pipeline")
                if isinstance(item, Refusal):
                    await answer_refusal(self, item)
                    keep = False
                elif isinstance(item.body.failed, Refusal):  # its framing broke before its turn
                    await answer_refusal(self, item.body.failed)
                    keep = False
                elif self.server.hand_off is not None and is_websocket(item):
                    self._hand_off(item)
                    return
                else:
                    keep = await answer_one(self, item)
        except Exception:  # a bug here ends this connection, never the server
            log.exception("http_connection_failed", peer=self.remote)
            self.server.refused[Refused.HANDLER_FAILED] += 1
            keep = False
        finally:
            self._task = None
        done_reading = (self._stopped or self._eof) and not self._queue and not self._held
        if not keep or done_reading or self.server.closing:
            self.close()
        elif self._idle():
            self._went_idle()

    def _hand_off(self, request: Request) -> None:
        """The transport, this request and what followed its head, to `server.hand_off`; this
        connection only waits for the close now (`connection_lost`, called by the new protocol)."""
        assert self.server.hand_off is not None and self.transport is not None
        tail = self._upgrade_tail
        if tail is None:  # llhttp did not take it for an upgrade: what it read of a body, then nothing
            tail = b"".join(request.body.take())
        self._stop_reading()
        self._queue.clear()
        self._held = b""
        self.handed_off = True
        self.server.hand_off(self, request, tail)

    # ---- ending
    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def shutdown(self) -> None:
        """The server stops: an idle connection closes now, a busy one after its answer (one
        handed off is its new protocol's to end)."""
        if self.handed_off:
            return
        self._stop_reading()
        if self._idle():
            self.close()

    def abort(self) -> None:
        if self._task is not None and not self.handed_off:
            self._task.cancel()
        if self.transport is not None:
            self.transport.abort()
