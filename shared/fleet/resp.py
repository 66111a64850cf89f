"""Redis replies, parsed from bytes in one pass: what `BatchingRedis` reads for an exchange's replies
(issue 27 §4: redis-py's reader spends ~20 µs per reply on this machine, in layers of awaits,
timeouts and per-line stream reads; this parse takes a few).

Pure: `parse(data, count)` answers the first `count` replies of `data` and where they end, or
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

from typing import Any

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
