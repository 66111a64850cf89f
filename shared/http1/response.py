"""What goes back: `Response` (a whole body, with Content-Length) and `StreamResponse` (a head,
then writes: chunked on HTTP/1.1, close-delimited on 1.0).

The head is written as aiohttp writes it: the handler's headers in their order, Content-Type,
the framing header, Date, Server (and `Connection: keep-alive` to an HTTP/1.0 peer that asked
for it, `Connection: close` to an HTTP/1.1 one when the connection ends after this answer). A
HEAD request gets the head only. Each write waits while the peer's socket is full
(`Connection.drain`): a reader that stops reading holds its handler, not the daemon's memory.

`headers` is a dict, or any mutable mapping given (the data plane's `CIMultiDict`, for an
upstream's repeated headers): what its `items()` yields is written. A `StreamResponse` with
`head_with_body` set holds its head until the first body write (one write for an answer that
arrives whole; aiohttp's `_send_headers_immediately = False`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from shared.http1.headers import content_type_of, reason_of

if TYPE_CHECKING:
    from shared.http1.request import Request

SERVER = "leasehold"
_SERVER_LINE = f"Server: {SERVER}"
_CHUNKED_LINE = "Transfer-Encoding: chunked"
_FIELD = ": ".join  # a (name, value) pair of str → its header line


def _has(headers: Mapping[str, str], name: str) -> str | None:
    """`name`'s value, its case aside: a look-up where the mapping is case-insensitive (not a
    dict: the data plane's `CIMultiDict`) or spells it so, else a scan."""
    value = headers.get(name)
    if value is not None or not isinstance(headers, dict):
        return value
    lowered = name.lower()
    return next((found for key, found in _items(headers) if key.lower() == lowered), None)


def _items(headers: Mapping[str, str]) -> Iterable[tuple[str, str]]:
    return headers.items()


STATUS_LINES_MAX = 256  # status lines kept (a relayed reason phrase is the upstream's): cleared when full
REASON_KEPT_MAX = 64  # a longer reason phrase (a peer's) is formatted every time, never kept
_status_lines: dict[tuple[tuple[int, int], int, str], str] = {}


def status_line(version: tuple[int, int], status: int, reason: str) -> str:
    """`HTTP/1.1 200 OK`, formatted once per version, status and reason (issue 27: ~3k
    instructions a response); the memo holds at most `STATUS_LINES_MAX` short lines."""
    key = (version, status, reason)
    line = _status_lines.get(key)
    if line is None:
        line = f"HTTP/{version[0]}.{version[1]} {status} {reason}"
        if len(reason) <= REASON_KEPT_MAX:
            if len(_status_lines) >= STATUS_LINES_MAX:
                _status_lines.clear()
            _status_lines[key] = line
    return line


def header_lines(headers: Mapping[str, str]) -> list[str]:
    """`f"{name}: {value}"` for each header, in order. Names and values are str (as they always
    are): joined in C, no format per header (issue 27: ~2k instructions per header less for a
    `CIMultiDict`'s); anything else is formatted, as it always was."""
    try:
        return list(map(_FIELD, headers.items()))
    except TypeError:
        return [f"{name}: {value}" for name, value in headers.items()]


class StreamResponse:
    head_with_body = False  # the head waits for the first body write

    def __init__(self, status: int = 200, reason: str | None = None, headers: MutableMapping[str, str] | None = None):
        self.status = status
        self.reason = reason or reason_of(status)
        self.headers: MutableMapping[str, str] = (
            {} if headers is None else dict(headers) if isinstance(headers, dict) else headers
        )
        self.force_close_after = False
        self._request: Request | None = None
        self._chunked = False
        self._head_only = False
        self._eof = False
        self._held_head = b""

    @property
    def content_length(self) -> int | None:
        value = _has(self.headers, "Content-Length")
        return None if value is None else int(value)

    @content_length.setter
    def content_length(self, value: int) -> None:
        self.headers["Content-Length"] = str(value)

    @property
    def content_type(self) -> str:
        """The media type of its Content-Type (aiohttp's `content_type`)."""
        return content_type_of(_has(self.headers, "Content-Type"))

    @property
    def prepared(self) -> bool:
        return self._request is not None

    @property
    def ended(self) -> bool:
        """`write_eof` ran: nothing more goes out."""
        return self._eof

    @property
    def keep_alive(self) -> bool:
        connection = _has(self.headers, "Connection")
        return not self.force_close_after and (connection is None or connection.lower() != "close")

    def force_close(self) -> None:
        self.force_close_after = True

    def enable_chunked_encoding(self) -> None:
        """aiohttp's name; a stream without Content-Length is chunked on HTTP/1.1 anyway."""

    async def prepare(self, request: Request) -> None:
        if self._request is None:
            head = self._start(request)
            if self.head_with_body and not self._head_only:
                self._held_head = head
            else:
                await request._conn.write(head)

    def _start(self, request: Request) -> bytes:
        """The head, once: the response is bound to `request` from here on."""
        self._request = request
        request.started = True
        self._head_only = request.method == "HEAD"
        length = _has(self.headers, "Content-Length")
        framing = None  # its line, when the head names it
        if length is None and request.version >= (1, 1):
            self._chunked = True
            framing = _CHUNKED_LINE
        elif length is None:
            self.force_close_after = True  # HTTP/1.0: the close ends the body
        return self._head(request, framing)

    def _head(self, request: Request, framing: str | None) -> bytes:
        conn = request._conn
        lines = [status_line(request.version, self.status, self.reason)]
        lines += header_lines(self.headers)
        if framing is not None:
            lines.append(framing)
        lines.append(f"Date: {conn.server.date.now()}")
        lines.append(_SERVER_LINE)
        if _has(self.headers, "Connection") is None:  # as aiohttp says it
            keep = request.keep_alive and not self.force_close_after  # (`keep_alive`, no header)
            if request.version < (1, 1) and keep:
                lines.append("Connection: keep-alive")
            elif request.version >= (1, 1) and not keep:
                lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")

    async def write(self, data: bytes) -> None:
        if self._request is None:
            raise RuntimeError("write before prepare")
        if self._eof:
            raise RuntimeError("write after write_eof")
        if self._head_only or not data:
            return
        if self._chunked:
            data = b"%x\r\n%b\r\n" % (len(data), data)
        if self._held_head:
            data, self._held_head = self._held_head + data, b""
        await self._request._conn.write(data)

    async def write_eof(self, data: bytes = b"") -> None:
        if self._eof:
            return
        if data:
            await self.write(data)
        self._eof = True
        if self._held_head and self._request is not None:
            head, self._held_head = self._held_head, b""
            await self._request._conn.write(head)
        if self._chunked and not self._head_only and self._request is not None:
            await self._request._conn.write(b"0\r\n\r\n")


class Response(StreamResponse):
    def __init__(
        self,
        *,
        body: bytes | None = None,
        text: str | None = None,
        status: int = 200,
        reason: str | None = None,
        headers: MutableMapping[str, str] | None = None,
        content_type: str | None = None,
    ) -> None:
        super().__init__(status, reason, headers)
        if text is not None:
            body = text.encode("utf-8")
            content_type = content_type or "text/plain"
            if "charset" not in content_type:
                content_type += "; charset=utf-8"
        if content_type is not None:
            self.headers["Content-Type"] = content_type
        elif _has(self.headers, "Content-Type") is None:
            self.headers["Content-Type"] = "application/octet-stream"
        self.body = body or b""

    async def prepare(self, request: Request) -> None:
        if self._request is None:
            self.headers["Content-Length"] = str(len(self.body))
        await super().prepare(request)

    async def send(self, request: Request) -> None:
        """Head and body in one write (one syscall for a small answer)."""
        if self._request is not None:
            raise RuntimeError("a Response is sent once")
        self.headers["Content-Length"] = str(len(self.body))
        head = self._start(request)
        await request._conn.write(head if self._head_only else head + self.body)
        self._eof = True


def text_response(status: int, text: str, headers: dict[str, Any]) -> Response:
    """An HTTPException's answer: `headers` carries its Content-Type first, as aiohttp orders it."""
    return Response(body=text.encode("utf-8"), status=status, headers=headers)
