"""`GatewayError`: how a shell says "refused, with this code". One renderer per surface turns
it into the surface's error shape (control JSON, or the Anthropic / OpenAI wire)."""

from __future__ import annotations

from typing import Any

from shared.codes import HTTP_STATUS, ErrorCode, Refusal


class GatewayError(Exception):
    """`code` is a refusal (the gateway declined) or another error code (bad input, a missing
    thing, a lost race, the upstream's failure)."""

    def __init__(
        self,
        code: Refusal | ErrorCode,
        detail: str,
        *,
        status: int | None = None,
        retry_after_s: float | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.status = status if status is not None else HTTP_STATUS[code]
        self.retry_after_s = retry_after_s
        self.extra = extra or {}
