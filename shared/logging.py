"""structlog JSON to stdout, behind a redactor that no secret gets past.

Redaction works by shape (provider keys, bearer tokens, `lhgw_` tokens, anything after
`x-api-key`/`authorization`) and by value (every live credential and control token registered
with `register_secret`). It runs over every free-text string in the event, nested containers
included, and over exception text, so a secret in a URL or an error message is scrubbed as
well; only the values the gateway generates itself (`SAFE_KEYS`: the event name, ids it made,
closed codes) and numbers are passed as they are.

Lines are rendered with msgspec and written once per event-loop iteration (`LineWriter`):
the one `request_done` line per request stays, at a few microseconds.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, MutableMapping
from datetime import UTC, datetime
from typing import Any, NamedTuple

import msgspec
import structlog

REDACTED = "[redacted]"

_SHAPES = re.compile(
    r"lhgw_[A-Za-z0-9._~+/=-]*"  # virtual keys, whole or partial
    r"|sk-ant-[A-Za-z0-9_-]{8,}"  # Anthropic keys
    r"|sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{16,}"  # OpenAI-style keys
    r"|(?i:bearer)\s+[A-Za-z0-9._~+/=-]{8,}"  # bearer credentials
    r"|(?i:(?:x-api-key|authorization|api[_-]?key|token|secret)[\"']?\s*[:=]\s*[\"']?)[^\s\"',}]{8,}"
)

_secret_values: set[str] = set()
_secret_pattern: re.Pattern[str] | None = None
_lock = threading.Lock()


def register_secret(value: str | None) -> None:
    """Scrub `value` from every later log line (values shorter than 6 chars are ignored)."""
    global _secret_pattern, _generation
    if not value or len(value) < 6:
        return
    with _lock:
        if value in _secret_values:
            return
        _secret_values.add(value)
        ordered = sorted(_secret_values, key=len, reverse=True)
        _secret_pattern = re.compile("|".join(re.escape(v) for v in ordered))
        _generation += 1
        _memo.clear()


def redact_text(text: str) -> str:
    pattern = _secret_pattern
    if pattern is not None:
        text = pattern.sub(REDACTED, text)
    return _SHAPES.sub(_shape_replacement, text)


def _shape_replacement(match: re.Match[str]) -> str:
    found = match.group(0)
    lowered = found.lower()
    for label in ("x-api-key", "authorization", "api_key", "api-key", "apikey", "token", "secret"):
        if lowered.startswith(label):
            cut = len(found) - len(found.lstrip("\"' :=" + found[: len(label)]))
            prefix = found[: max(cut, len(label))]
            return prefix + REDACTED
    if lowered.startswith("bearer"):
        return "Bearer " + REDACTED
    return REDACTED


def redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return redact_text(bytes(value).decode("utf-8", "replace"))
    return value


# Keys whose values the gateway makes itself (the event name, ids it generated, closed codes):
# they cannot hold a secret, so the redactor does not scan them. Every other string — free
# text, URLs, reasons, error messages — is scanned; numbers, booleans and None are not.
SAFE_KEYS = frozenset({"event", "attempt_id", "status", "code"})
# Scan results of short repeated values (account ids, key ids, paths) are kept, this many;
# registering a secret forgets them all.
_MEMO_CAP = 4096
_MEMO_LEN = 200  # longer text (tracebacks, messages) is scanned every time, never kept
_memo: dict[str, str] = {}
_generation = 0  # bumped by every `register_secret`


def _redact_str(text: str) -> str:
    found = _memo.get(text)
    if found is None:
        generation = _generation
        found = redact_text(text)
        if len(text) > _MEMO_LEN or generation != _generation:
            return found  # too long to keep, or a secret was registered while scanning
        if len(_memo) >= _MEMO_CAP:
            _memo.clear()
        _memo[text] = found
    return found


def _redactor(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    memo = _memo  # a remembered scan is read here, without `_redact_str`'s call (issue 27)
    for key, value in event.items():
        kind = type(value)
        if kind is str:
            if key not in SAFE_KEYS:
                found = memo.get(value)
                event[key] = found if found is not None else _redact_str(value)
        elif kind is not int and kind is not float and kind is not bool and value is not None:
            event[key] = redact_value(value)
    return event


def _fallback(value: Any) -> str:
    """Anything msgspec cannot encode is logged as its repr, redacted."""
    return redact_text(repr(value))


_encode = msgspec.json.Encoder(enc_hook=_fallback).encode


_DIGITS3 = tuple(f"{n:03d}" for n in range(1000))
_DIGITS3Z = tuple(f"{n:03d}Z" for n in range(1000))


class _Stamper:
    """`timestamp` as ISO 8601 UTC with microseconds and a `Z`; the second's text is cached."""

    __slots__ = ("second", "prefix")

    def __init__(self) -> None:
        self.second = -1
        self.prefix = ""

    def __call__(self) -> str:
        second, micro = divmod(time.time_ns() // 1000, 1_000_000)
        if second != self.second:
            self.second = second
            self.prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        milli, rest = divmod(micro, 1000)
        return self.prefix + _DIGITS3[milli] + _DIGITS3Z[rest]  # no format spec parsed per line


def _renderer(service: str) -> Callable[[Any, str, MutableMapping[str, Any]], bytes]:
    """The one processor: exception text, redaction, service/level/time, msgspec JSON."""
    stamp = _Stamper()
    levels = {"warn": "warning", "exception": "error"}

    def render(logger: Any, name: str, event: MutableMapping[str, Any]) -> bytes:
        if "exc_info" in event:
            event = structlog.processors.format_exc_info(logger, name, event)
        event = _redactor(logger, name, event)
        event["service"] = service
        event["level"] = levels.get(name, name)
        event["timestamp"] = stamp()
        return _encode(event)

    return render


class LineWriter:
    """Where rendered lines go: one `write` per event-loop iteration, not one per line.

    Inside a running loop a line is queued and a single `call_soon` callback writes every
    queued line together (a burst of requests costs one syscall); outside a loop (a worker
    thread, a script) a line is written at once, with whatever is queued before it. Lines
    still queued at exit are written then.
    """

    def __init__(self, stream: Any) -> None:
        binary = getattr(stream, "buffer", None)
        self._text = stream
        self._out = binary if binary is not None else stream
        self._binary = binary is not None
        self._lines: list[bytes] = []
        self._scheduled = False
        self._lock = threading.Lock()
        atexit.register(self.flush)

    def msg(self, line: bytes) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._lock:
            self._lines.append(line)
            if loop is None:
                self._write_queued()
            elif not self._scheduled:
                self._scheduled = True
                loop.call_soon(self.flush)

    debug = info = warning = warn = error = err = critical = fatal = exception = failure = log = msg

    def flush(self) -> None:
        with self._lock:
            self._scheduled = False
            self._write_queued()

    def _write_queued(self) -> None:
        lines = self._lines
        if not lines:
            return
        self._lines = []
        data = b"\n".join(lines) + b"\n"
        try:
            if self._binary:
                self._text.flush()  # whatever went through the text layer goes first
                self._out.write(data)
            else:
                self._out.write(data.decode("utf-8"))
            self._out.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stdout must not take a request down with it


def configure_logging(
    service: str, level: str = "info", stream: Any = None, secrets: Iterable[str | None] = ()
) -> None:
    """Configure structlog for a daemon: JSON lines, one redactor as the last word."""
    for secret in secrets:
        register_secret(secret)
    global _line
    level_no = getattr(logging, level.upper(), logging.INFO)
    writer = LineWriter(stream or sys.stdout)
    render = _renderer(service)
    _line = _Line(render, writer, level_no)
    structlog.configure(
        processors=[render],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=lambda *_args: writer,
        cache_logger_on_first_use=True,
    )
    # Library loggers (aiohttp, asyncio) go through the same redactor.
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(_StdlibRedactingFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(level_no, logging.WARNING))


class _StdlibRedactingFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        import json

        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        return json.dumps(
            {
                "event": redact_text(message),
                "logger": record.name,
                "level": record.levelname.lower(),
                "service": self.service,
            }
        )


def get_logger(name: str | None = None) -> Any:
    return structlog.get_logger(name)


class _Line(NamedTuple):
    """What `configure_logging` set up: the one processor, the writer, the least level."""

    render: Callable[[Any, str, MutableMapping[str, Any]], bytes]
    writer: LineWriter
    level_no: int


_line: _Line | None = None  # None until `configure_logging`: structlog's own defaults then


def reset_logging() -> None:
    """Undo `configure_logging` (tests): structlog's defaults, and `info_line` follows them."""
    global _line
    _line = None
    structlog.reset_defaults()


def info_line(name: str, event: str, **fields: Any) -> None:
    """`get_logger(name).info(event, **fields)`, byte for byte, without structlog's bound logger.

    For the one line per request (`request_done`): structlog's proxy, bind and event processing
    around the renderer cost more than rendering the line (~35k instructions per request,
    issue 27). The line is the same: the fields in the caller's order, then `event`, through the
    same processor (redaction, service, level, timestamp, msgspec JSON) to the same writer, and
    only when `info` passes the configured level. Before `configure_logging` it is structlog's.
    """
    line = _line
    if line is None:
        structlog.get_logger(name).info(event, **fields)
        return
    if line.level_no > logging.INFO:
        return
    fields["event"] = event
    line.writer.msg(line.render(line.writer, "info", fields))
