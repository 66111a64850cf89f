"""What the relay learns from a 2xx answer while forwarding it untouched.

An SSE answer is read by its wire's incremental scanner (usage, served model, terminal event);
a JSON answer on a path that reports usage is kept by reference, up to `USAGE_BODY_CAP`, and
decoded once at its end. The relayed bytes are never changed: compressed bodies are
decompressed only into the scanner's copy.
"""

from __future__ import annotations

from dataplane.endings import is_complete
from dataplane.wires.spec import WireSpec
from dataplane.wires.sse import Decompressor, Observation, SseScanner

# A non-streaming 2xx body is kept (by reference) up to this size to read its usage; larger
# bodies (none of the usage-bearing answers is near it) are relayed without usage.
USAGE_BODY_CAP = 8 * 1024 * 1024


class Observer:
    __slots__ = ("wire", "path", "is_sse", "decompress", "scanner", "parts", "size", "seen")

    def __init__(self, wire: WireSpec, path: str, is_sse: bool, encoding: str) -> None:
        self.wire = wire
        self.path = path
        self.is_sse = is_sse
        self.decompress = Decompressor(encoding)
        self.scanner: SseScanner | None = None
        self.parts: list[bytes] | None = None
        self.size = 0
        if is_sse:
            self.scanner = wire.scanner(path)
            self.seen = self.scanner.seen  # partial usage stays readable if the attempt is cut
        else:
            self.seen = Observation()
            if path in wire.usage_paths:
                self.parts = []

    def feed(self, chunk: bytes) -> None:
        scanner = self.scanner
        if scanner is not None:
            if self.decompress.supported:
                scanner.feed(self.decompress(chunk))
        elif self.parts is not None:
            self.size += len(chunk)
            if self.size <= USAGE_BODY_CAP:
                self.parts.append(chunk)
            else:
                self.parts = None

    def complete(self) -> bool:
        seen = self.seen
        return is_complete(self.path, self.is_sse, self.decompress.supported, seen.terminal, seen.finish_seen)

    def finish(self) -> Observation:
        """The observation at the end of a cleanly ended body (decodes a kept JSON body)."""
        if self.parts and self.decompress.supported:
            body = self.decompress(b"".join(self.parts))
            self.seen.model, self.seen.usage = self.wire.usage_from_body(body)
            self.parts = None
        return self.seen
