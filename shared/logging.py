"""structlog JSON to stdout, behind a redactor that no secret gets past.

Redaction works by shape (provider keys, bearer tokens, `lhgw_` tokens, anything after
`x-api-key`/`authorization`) and by value (every live credential and control token registered
with `register_secret`). It runs over every string in the event, nested containers included,
and over exception text, so a secret in a URL or an error message is scrubbed as well.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
from collections.abc import Iterable
from typing import Any

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
    global _secret_pattern
    if not value or len(value) < 6:
        return
    with _lock:
        if value in _secret_values:
            return
        _secret_values.add(value)
        ordered = sorted(_secret_values, key=len, reverse=True)
        _secret_pattern = re.compile("|".join(re.escape(v) for v in ordered))


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


def _redactor(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
    return {key: redact_value(value) for key, value in event.items()}


def configure_logging(service: str, level: str = "info", stream: Any = None,
                      secrets: Iterable[str | None] = ()) -> None:
    """Configure structlog for a daemon: JSON lines, one redactor as the last word."""
    for secret in secrets:
        register_secret(secret)
    level_no = getattr(logging, level.upper(), logging.INFO)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _redactor,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.WriteLoggerFactory(file=stream or sys.stdout),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)
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
        return json.dumps({
            "event": redact_text(message),
            "logger": record.name,
            "level": record.levelname.lower(),
            "service": self.service,
        })


def get_logger(name: str | None = None) -> Any:
    return structlog.get_logger(name)
