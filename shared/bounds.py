"""Bounds and roundings both daemons and every route must spell the same way.

- A lease's TTL is 60..86400 seconds (SPEC §2), for `GATEWAY_KEY_TTL_SECONDS` and every
  `ttl_seconds` a route accepts.
- A `Retry-After` is whole seconds, rounded up, at least 1 (SPEC §15: clients read it as an
  integer; 0 would make Codex retry at once).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

TTL_MIN_S = 60
TTL_MAX_S = 86400
TtlSeconds = Annotated[int, msgspec.Meta(ge=TTL_MIN_S, le=TTL_MAX_S)]


def retry_after_s(seconds: float) -> int:
    """Whole seconds for a `Retry-After` header: rounded up, at least 1."""
    return max(1, int(seconds + 0.999))


def retry_after_ms(wait_ms: int) -> int:
    """The same rounding for a wait in milliseconds."""
    return max(1, (wait_ms + 999) // 1000)
