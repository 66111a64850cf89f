"""The incremental SSE scanner: same answer whatever the chunking, bounded carry, skips cheaply."""

from __future__ import annotations

import random

import pytest

from dataplane.wires import anthropic, openai
from dataplane.wires.sse import CARRY_CAP, Decompressor, SseScanner
from shared.wire import Usage
from tests.support.stub_upstream import anthropic_events, chat_events, response_events


class Recorder(SseScanner):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[bytes, bytes]] = []

    def on_event(self, name: bytes, data: bytes) -> None:
        self.events.append((name, data))


def chunked(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), k=min(len(data) - 1, rng.randint(1, 40))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]


STREAMS = {
    "anthropic": (b"".join(anthropic_events("claude-sonnet-4-6", 3)), anthropic.Scanner),
    "chat": (b"".join(chat_events("gpt-5", 3, {"stream_options": {"include_usage": True}})), openai.ChatScanner),
    "responses": (b"".join(response_events("gpt-5", 3)), openai.ResponsesScanner),
}


@pytest.mark.parametrize("kind", sorted(STREAMS))
@pytest.mark.parametrize("crlf", [False, True], ids=["lf", "crlf"])
def test_any_chunking_gives_the_same_observation(kind: str, crlf: bool) -> None:
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    data, make = STREAMS[kind]
    if crlf:
        data = data.replace(b"\n", b"\r\n")
    whole = make()
    whole.feed(data)
    assert whole.seen.terminal and whole.seen.usage is not None
    for _ in range(30):
        scanner = make()
        for piece in chunked(data, rng):
            scanner.feed(piece)
        assert (scanner.seen.usage, scanner.seen.model, scanner.seen.terminal) == (
            whole.seen.usage,
            whole.seen.model,
            whole.seen.terminal,
        )
    byte_by_byte = make()
    for i in range(len(data)):
        byte_by_byte.feed(data[i : i + 1])
    assert byte_by_byte.seen.usage == whole.seen.usage and byte_by_byte.seen.terminal


def test_event_fields_multiline_data_and_comments() -> None:
    r = Recorder()
    r.feed(b": keepalive comment\n\nevent: a\ndata: one\ndata: two\n\nid: 7\ndata:x\n\nretry: 5\n\n")
    assert r.events == [(b"a", b"one\ntwo"), (b"", b"x")]


def test_an_oversized_event_is_skipped_not_buffered() -> None:
    r = Recorder()
    r.feed(b"data: " + b"x" * (CARRY_CAP + 10))
    assert r._carry == b""
    r.feed(b"still the same event\n\ndata: next\n\n")
    assert r.events == [(b"", b"next")]


def test_unwanted_events_are_not_decoded() -> None:
    scanner = anthropic.Scanner()
    scanner.feed(b"event: content_block_delta\ndata: {not json\n\n")
    scanner.feed(b'event: message_delta\ndata: {"usage":{"output_tokens":9}}\n\n')
    assert scanner.seen.usage == Usage(output_tokens=9) and not scanner.seen.terminal


def test_malformed_json_is_ignored_and_does_not_end_the_stream() -> None:
    scanner = openai.ChatScanner()
    scanner.feed(b'data: {malformed\n\ndata: {"model":"gpt-5","choices":[]}\n\n')
    assert scanner.seen.model == "gpt-5" and not scanner.seen.terminal and not scanner.seen.upstream_error


@pytest.mark.parametrize(
    "encoding,plain,supported",
    [
        ("", True, True),
        ("identity", True, True),
        ("gzip", False, True),
        ("deflate", False, True),
        ("br", False, False),
        ("zstd", False, False),
    ],
)
def test_decompressor_capabilities(encoding: str, plain: bool, supported: bool) -> None:
    d = Decompressor(encoding)
    assert (d.plain, d.supported) == (plain, supported)


def test_gzip_copy_is_decompressed_incrementally() -> None:
    import zlib

    data, _ = STREAMS["anthropic"]
    compressor = zlib.compressobj(wbits=31)
    blob = compressor.compress(data) + compressor.flush()
    d = Decompressor("gzip")
    scanner = anthropic.Scanner()
    for i in range(0, len(blob), 7):
        scanner.feed(d(blob[i : i + 7]))
    assert scanner.seen.terminal and scanner.seen.usage is not None
    broken = Decompressor("gzip")
    assert broken(b"not gzip at all") == b"" and not broken.supported
