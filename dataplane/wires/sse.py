"""An incremental SSE observer: sees each event of a relayed stream without changing a byte.

The relay forwards the original chunks; this scanner only reads them (or their decompressed
copy) to learn the served model, the usage and whether the wire's terminal event arrived. Only
events a wire cares about are JSON-decoded. The carry buffer for a partial event is bounded:
an event larger than `CARRY_CAP` is skipped, not buffered.
"""

from __future__ import annotations

import zlib

from shared.wire import Usage

# One SSE event is rarely above a few KiB; a tool-call argument delta can reach a few hundred.
CARRY_CAP = 1024 * 1024


class Observation:
    """What a scanner has learned so far about one response."""

    __slots__ = ("model", "usage", "terminal", "finish_seen", "upstream_error", "blind")

    def __init__(self) -> None:
        self.model: str | None = None
        self.usage: Usage | None = None
        self.terminal = False  # the wire's terminal event arrived
        self.finish_seen = False  # chat completions: a choice carried finish_reason
        self.upstream_error = False  # the upstream itself sent an in-stream error event
        self.blind = False  # could not read the stream (unknown content-encoding)


class SseScanner:
    """Base scanner: splits events; subclasses implement `on_event(name, data)`.

    `wanted` names the events worth decoding (None: every event); an event whose first line
    names another event is skipped without looking at its data.
    """

    wanted: frozenset[bytes] | None = None

    def __init__(self) -> None:
        self.seen = Observation()
        self._carry = b""
        self._skipping = False

    def feed(self, data: bytes) -> None:
        buf = self._carry + data if self._carry else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            if self._skipping:
                self._skipping = False
            else:
                self._event(buf[start:end])
            start = end + 2
        rest = buf[start:]
        if len(rest) > CARRY_CAP:
            self._skipping, rest = True, b""
        self._carry = rest

    def _event(self, block: bytes) -> None:
        wanted = self.wanted
        if wanted is not None and block.startswith(b"event:"):
            cut = block.find(b"\n")
            if block[6 : cut if cut >= 0 else None].strip() not in wanted:
                return
        name = b""
        data = b""
        for line in block.split(b"\n"):
            if line.startswith(b"data:"):
                piece = line[5:]
                piece = piece[1:] if piece[:1] == b" " else piece
                data = data + b"\n" + piece if data else piece
            elif line.startswith(b"event:"):
                name = line[6:].strip()
        if name or data:
            self.on_event(name, data)

    def on_event(self, name: bytes, data: bytes) -> None:
        raise NotImplementedError


class Decompressor:
    """Decompresses a copy of the body for the scanner; the relayed bytes stay compressed."""

    def __init__(self, encoding: str) -> None:
        encoding = encoding.strip().lower()
        self.plain = encoding in ("", "identity")
        if self.plain:
            self._z = None
            self.supported = True
        elif encoding in ("gzip", "x-gzip"):
            self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
            self.supported = True
        elif encoding == "deflate":
            self._z = zlib.decompressobj()
            self.supported = True
        else:
            self._z = None
            self.supported = False

    def __call__(self, chunk: bytes) -> bytes:
        if self._z is None:
            return chunk
        try:
            return self._z.decompress(chunk)
        except zlib.error:
            self.supported = False
            self._z = None
            return b""
