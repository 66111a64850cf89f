"""Redis replies, parsed from bytes in one pass: what `BatchingRedis` reads for an exchange's replies
(issue 27 §4: redis-py's reader spends ~20 µs per reply on this machine, in layers of awaits,
timeouts and per-line stream reads; this parse takes a few).

Pure: `pack(commands)` encodes an exchange's commands (as redis-py's `pack_command`);
`parse(data, count)` answers the first `count` replies of `data` and where they end, or
raises `Incomplete` when `data` holds fewer (the caller reads more and parses again). Each reply is
what redis-py's own pure-Python reader answers for the connection's bytes when responses are not
decoded (tested reply type by reply type against it, `tests/unit/test_fleet_resp.py`): bytes for
a simple or bulk string (a verbatim string without its format), int, float, bool, None for a
null of either protocol, a list for an array or a set, a dict for a map, and an error reply as
the `ResponseError` redis-py makes of it (`NoScriptError` for `NOSCRIPT`), answered as a value,
not raised. A push or attribute reply, or a type byte that is none of these, is
`InvalidResponse`: the exchange fails, as redis-py's reader fails it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from redis._parsers.base import BaseParser
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse

MAX_DEPTH = 64  # nested aggregates deeper than any reply this gateway asks for


class Incomplete(Exception):
    """`data` ends before the replies asked for."""


def parse(data: bytes | bytearray, count: int, pos: int = 0) -> tuple[list[Any], int]:
    """The first `count` replies of `data` from `pos`, and the offset just past them. An error
    reply that redis-py raises rather than answers (a `ConnectionError`: `LOADING`, ...) is
    raised here too; a malformed length is `InvalidResponse`."""
    replies = []
    view = bytes(data) if isinstance(data, bytearray) else data
    try:
        for _ in range(count):
            reply, pos = _one(view, pos, 0)
            replies.append(reply)
    except ValueError as exc:
        raise InvalidResponse(f"Protocol Error: {exc}") from exc
    return replies, pos


def _error(text: bytes) -> Exception:
    error: Exception = BaseParser.parse_error(text.decode("utf-8", errors="replace"))
    if isinstance(error, RedisConnectionError):
        raise error
    return error


def _line(data: bytes, pos: int) -> tuple[bytes, int]:
    end = data.find(b"\r\n", pos)
    if end < 0:
        raise Incomplete
    return data[pos:end], end + 2


def _bulk(data: bytes, pos: int, length: int) -> tuple[bytes, int]:
    end = pos + length
    if len(data) < end + 2:
        raise Incomplete
    return data[pos:end], end + 2


def _one(data: bytes, pos: int, depth: int) -> tuple[Any, int]:
    if depth > MAX_DEPTH:
        raise InvalidResponse("Protocol Error: nested too deep")
    line, pos = _line(data, pos)
    kind, rest = line[:1], line[1:]
    if kind == b"$":
        length = int(rest)
        return (None, pos) if length < 0 else _bulk(data, pos, length)
    if kind == b":" or kind == b"(":
        return int(rest), pos
    if kind == b"*" or kind == b"~":
        length = int(rest)
        if length < 0:
            return None, pos
        items = []
        for _ in range(length):
            item, pos = _one(data, pos, depth + 1)
            items.append(item)
        return items, pos
    if kind == b"+":
        return rest, pos
    if kind == b"_":
        return None, pos
    if kind == b"-":
        return _error(rest), pos
    if kind == b"!":
        text, pos = _bulk(data, pos, int(rest))
        return _error(text), pos
    if kind == b",":
        return float(rest), pos
    if kind == b"#":
        return rest == b"t", pos
    if kind == b"=":
        text, pos = _bulk(data, pos, int(rest))
        return text[4:], pos
    if kind == b"%":
        mapping = {}
        for _ in range(int(rest)):
            key, pos = _one(data, pos, depth + 1)
            mapping[key], pos = _one(data, pos, depth + 1)
        return mapping, pos
    raise InvalidResponse(f"Protocol Error: {line[:40]!r}")


def pack(commands: Sequence[Sequence[object]]) -> bytes:
    """The RESP encoding of `commands`, byte for byte what redis-py's `pack_command` writes for
    single-word commands (those of `BATCHED`), in one pass (tested against it): bytes as they
    are, str as UTF-8, int and float by `repr`; anything else (a bool, None) is refused as
    redis-py refuses it, `DataError`, and nothing of the batch is sent.

    Every part (`*n`, `$size`, the argument) joined by CRLF in one `join`, the headers of the
    common sizes taken from a table: no `%`-formatting (a copy of each argument) per argument
    (issue 27 §4: a mint's claims 12–19 → 9.5 µs here)."""
    out: list[bytes] = []
    append = out.append
    for command in commands:
        args: Sequence[Any] = command
        count = len(args)
        append(_COUNTS[count] if count < _TABLED else b"*%d" % count)
        for arg in args:
            kind = type(arg)  # the common types first, by identity (no isinstance chain)
            if kind is str:
                data = arg.encode()
            elif kind is bytes:
                data = arg
            elif kind is int:
                data = b"%d" % arg
            elif isinstance(arg, bytes):
                data = arg
            elif isinstance(arg, str):
                data = arg.encode()
            elif isinstance(arg, (int, float)) and not isinstance(arg, bool):
                data = repr(arg).encode()
            elif isinstance(arg, (bytearray, memoryview)):
                data = bytes(arg)
            else:
                raise redis.DataError(
                    f"Invalid input of type: '{type(arg).__name__}'. Convert to a bytes, string, int or float first."
                )
            size = len(data)
            append(_SIZES[size] if size < _TABLED else b"$%d" % size)
            append(data)
    if not out:
        return b""
    append(b"")  # the last part's CRLF
    return b"\r\n".join(out)


_TABLED = 1024  # `pack`'s headers of fewer parts or bytes than this are made once, here
_COUNTS = tuple(b"*%d" % n for n in range(_TABLED))
_SIZES = tuple(b"$%d" % n for n in range(_TABLED))
