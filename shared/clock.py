"""Wall-clock helpers for shells (cores take time as an argument instead)."""

from __future__ import annotations

import time
from datetime import UTC, datetime


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def iso_ms(ms: int) -> str:
    """ISO 8601 UTC with millisecond precision and a `Z`."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
