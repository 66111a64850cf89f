"""`MintAnswer`: what the mint desk answers a mint, a renewal or an extension with (status, body,
`Retry-After`, `x-should-retry: false`); the HTTP handlers only render it."""

from __future__ import annotations

import msgspec


class MintAnswer(msgspec.Struct, frozen=True):
    status: int
    body: dict
    retry_after_s: int | None = None
    no_retry: bool = False  # `x-should-retry: false` (model-unpriced)
