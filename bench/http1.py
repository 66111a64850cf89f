"""A lean HTTP/1.1 client for the load generator: keep-alive sockets, prebuilt request bytes.

Rule: the generator must cost far less per request than any server it measures, so this client
does the minimum. Requests are built once (`build_request`) and written as they are; answers
are parsed only as far as framing needs — status line, Content-Length or chunked encoding —
and the body is counted, not kept, unless a caller asks for it. One request at a time per
connection (no pipelining), so a connection's timings are that request's alone.

`ResponseParser` is pure (bytes in, state out) and tested by tables; `Http1Connection` is the
asyncio shell that timestamps the first body byte and the end of each answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

# A response head larger than this is a broken peer, not a slow one (servers cap theirs lower).
MAX_HEAD_BYTES = 64 * 1024

_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _UNTIL_CLOSE, _DONE = range(8)


class ProtocolError(Exception):
    """The server's bytes are not a valid HTTP/1.1 answer."""


def build_request(
    method: str, path: str, host: str, headers: Mapping[str, str] | None = None, body: bytes = b""
) -> bytes:
    """The exact bytes of one request; Content-Length is added when there is a body."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class ResponseParser:
    """Incremental framing of one HTTP/1.1 response; `feed` returns True once it is complete."""

    __slots__ = ("_buf", "_state", "_remaining", "status", "body_bytes", "keep_body", "body", "close_after")

    def __init__(self, keep_body: bool = False) -> None:
        self._buf = bytearray()
        self._state = _HEAD
        self._remaining = 0
        self.status = 0
        self.body_bytes = 0
        self.keep_body = keep_body
        self.body = bytearray()
        self.close_after = False

    @property
    def done(self) -> bool:
        return self._state == _DONE

    def feed(self, data: bytes) -> bool:
        state = self._state
        if state == _LENGTH and not self._buf:  # the common case: no buffering, no copy
            return self._take_length(data)
        if state == _UNTIL_CLOSE:
            self._count(data)
            return False
        if state == _DONE:
            if data:
                raise ProtocolError("bytes after the end of the response")
            return True
        self._buf += data
        return self._drain()

    def eof(self) -> bool:
        """The peer closed; True if that legitimately ends the response (no framing)."""
        if self._state == _UNTIL_CLOSE:
            self._state = _DONE
        return self._state == _DONE

    def _count(self, data: bytes | bytearray | memoryview) -> None:
        self.body_bytes += len(data)
        if self.keep_body:
            self.body += data

    def _take_length(self, data: bytes | bytearray) -> bool:
        n = len(data)
        if n > self._remaining:
            raise ProtocolError("more body than Content-Length announced")
        self._count(data)
        self._remaining -= n
        if self._remaining == 0:
            self._state = _DONE
        return self._state == _DONE

    def _drain(self) -> bool:
        buf = self._buf
        pos = 0
        while True:
            state = self._state
            if state == _HEAD:
                end = buf.find(b"\r\n\r\n", pos)
                if end < 0:
                    if len(buf) - pos > MAX_HEAD_BYTES:
                        raise ProtocolError("response head too large")
                    break
                self._parse_head(bytes(buf[pos:end]))
                pos = end + 4
            elif state == _LENGTH:
                take = min(self._remaining, len(buf) - pos)
                self._take_length(buf[pos : pos + take])
                pos += take
                if self._state == _LENGTH:
                    break
            elif state == _CHUNK_SIZE or state == _TRAILER:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    break
                line = bytes(buf[pos:end])
                pos = end + 2
                if state == _TRAILER:
                    if not line:
                        self._state = _DONE
                    continue
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise ProtocolError(f"bad chunk size line {line[:40]!r}") from None
                self._remaining = size
                self._state = _CHUNK_DATA if size else _TRAILER
            elif state == _CHUNK_DATA:
                take = min(self._remaining, len(buf) - pos)
                if take == 0:
                    break
                self._count(memoryview(buf)[pos : pos + take])
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    self._state = _CHUNK_END
            elif state == _CHUNK_END:
                if len(buf) - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise ProtocolError("chunk not followed by CRLF")
                pos += 2
                self._state = _CHUNK_SIZE
            elif state == _UNTIL_CLOSE:
                self._count(buf[pos:])
                pos = len(buf)
                break
            else:  # _DONE
                if pos < len(buf):
                    raise ProtocolError("bytes after the end of the response")
                break
        del buf[:pos]
        return self._state == _DONE

    def _parse_head(self, head: bytes) -> None:
        if not head.startswith(b"HTTP/1.") or len(head) < 12 or not head[9:12].isdigit():
            raise ProtocolError(f"bad status line {head[:40]!r}")
        self.status = int(head[9:12])
        lower = head.lower()
        self.close_after = b"\r\nconnection: close" in lower
        if self.status < 200 or self.status in (204, 304):
            self._state = _DONE
        elif b"\r\ntransfer-encoding: chunked" in lower:
            self._state = _CHUNK_SIZE
        else:
            at = lower.find(b"\r\ncontent-length:")
            if at < 0:
                self._state = _UNTIL_CLOSE
                return
            end = lower.find(b"\r\n", at + 2)
            value = lower[at + 17 : end if end >= 0 else len(lower)].strip()
            if not value.isdigit():
                raise ProtocolError(f"bad Content-Length {value[:20]!r}")
            self._remaining = int(value)
            self._state = _LENGTH if self._remaining else _DONE


class Answer:
    """Timings (perf_counter seconds) and outcome of one exchange."""

    __slots__ = ("status", "sent_at", "first_at", "done_at", "body_bytes", "body", "error")

    def __init__(self, sent_at: float) -> None:
        self.status = 0
        self.sent_at = sent_at
        self.first_at = 0.0
        self.done_at = 0.0
        self.body_bytes = 0
        self.body = b""
        self.error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and 200 <= self.status < 300

    @property
    def total_s(self) -> float:
        return self.done_at - self.sent_at

    @property
    def ttfb_s(self) -> float:
        return (self.first_at or self.done_at) - self.sent_at


class Http1Connection(asyncio.Protocol):
    """One keep-alive client connection; `exchange()` sends prebuilt bytes, awaits the answer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._parser: ResponseParser | None = None
        self._answer: Answer | None = None
        self._future: asyncio.Future[Answer] | None = None
        self.closed = False

    @classmethod
    async def open(cls, host: str, port: int) -> Http1Connection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(cls, host, port)
        return conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    @property
    def streaming(self) -> bool:
        """An answer is in progress and its first body byte has arrived."""
        return self._answer is not None and bool(self._answer.first_at)

    def send(self, request: bytes, keep_body: bool = False) -> asyncio.Future[Answer]:
        """Write `request` now; the future resolves with its Answer (errors are in Answer.error)."""
        future = asyncio.get_running_loop().create_future()
        answer = Answer(time.perf_counter())
        if self.closed or self.transport is None:
            answer.error = "connection-closed"
            answer.done_at = answer.sent_at
            future.set_result(answer)
            return future
        self._parser = ResponseParser(keep_body)
        self._answer = answer
        self._future = future
        self.transport.write(request)
        return future

    def data_received(self, data: bytes) -> None:
        parser, answer = self._parser, self._answer
        if parser is None or answer is None:
            self._fail("unsolicited-bytes")
            return
        try:
            complete = parser.feed(data)
        except ProtocolError as exc:
            self._fail(f"protocol-error: {exc}")
            return
        if not answer.first_at and parser.body_bytes:
            answer.first_at = time.perf_counter()
        if complete:
            self._finish(parser, answer)

    def _finish(self, parser: ResponseParser, answer: Answer) -> None:
        answer.done_at = time.perf_counter()
        answer.status = parser.status
        answer.body_bytes = parser.body_bytes
        if parser.keep_body:
            answer.body = bytes(parser.body)
        future = self._future
        self._parser = self._answer = self._future = None
        if parser.close_after:
            self.close()
        if future is not None and not future.done():
            future.set_result(answer)

    def _fail(self, reason: str) -> None:
        answer, future = self._answer, self._future
        self._parser = self._answer = self._future = None
        self.close()
        if answer is not None and future is not None and not future.done():
            answer.done_at = time.perf_counter()
            answer.error = reason
            future.set_result(answer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        parser, answer = self._parser, self._answer
        if parser is not None and answer is not None and parser.eof():
            self._finish(parser, answer)
            return
        self._fail("connection-lost" if answer is None or not answer.first_at else "stream-cut")

    def close(self) -> None:
        self.closed = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
