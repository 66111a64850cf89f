"""The rate-limit headers a real provider sends on every answer (SPEC §22), for the stub.

Off unless the stub is started with `--rate-limit-headers` (`make_app(rate_limit_headers=True)`):
the benchmark turns it on so the data plane's parser (`dataplane/ratelimits.py`) runs on every
answer of `make bench` and its A/B, as it does in production; the system tests script the headers
they assert on instead (a step's `headers`), which override these.

The values move as a provider's do: each answer spends one request and some tokens of a window
that resets at the next minute (Anthropic states the reset as an RFC 3339 time, OpenAI as a Go
duration from now), and never below three quarters of the limit, so no headroom floor (at most
50 %) ever skips the stub's account.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

REQUESTS_LIMIT = 4000
TOKENS_LIMIT = 2_000_000


def go_duration(ms: int) -> str:
    """`ms` as OpenAI writes a reset: `120ms`, `6.5s`, `1m0.5s`."""
    if ms < 1000:
        return f"{ms}ms"
    minutes, rest = divmod(ms, 60_000)
    seconds = f"{rest / 1000:g}s"
    return f"{minutes}m{seconds}" if minutes else seconds


class RateLimitHeaders:
    """One provider's view of the stub's account: `headers(wire)` for each answer."""

    def __init__(self) -> None:
        self.answers = 0

    def headers(self, wire: str) -> dict[str, str]:
        self.answers += 1
        requests = str(REQUESTS_LIMIT - self.answers % (REQUESTS_LIMIT // 4))
        tokens = str(TOKENS_LIMIT - (self.answers * 37) % (TOKENS_LIMIT // 4))
        now_ms = int(time.time() * 1000)
        to_reset = 60_000 - now_ms % 60_000
        if wire == "openai":
            return {
                "x-ratelimit-limit-requests": str(REQUESTS_LIMIT),
                "x-ratelimit-remaining-requests": requests,
                "x-ratelimit-reset-requests": go_duration(to_reset),
                "x-ratelimit-limit-tokens": str(TOKENS_LIMIT),
                "x-ratelimit-remaining-tokens": tokens,
                "x-ratelimit-reset-tokens": go_duration(to_reset // 2),
            }
        reset = datetime.fromtimestamp((now_ms + to_reset) // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        found: dict[str, str] = {}
        for kind, remaining, limit in (
            ("requests", requests, REQUESTS_LIMIT),
            ("tokens", tokens, TOKENS_LIMIT),
            ("input-tokens", tokens, TOKENS_LIMIT),
            ("output-tokens", str(TOKENS_LIMIT // 5), TOKENS_LIMIT // 5),
        ):
            found[f"anthropic-ratelimit-{kind}-limit"] = str(limit)
            found[f"anthropic-ratelimit-{kind}-remaining"] = remaining
            found[f"anthropic-ratelimit-{kind}-reset"] = reset
        return found
