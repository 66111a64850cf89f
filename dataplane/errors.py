"""Gateway-authored answers in the worker's own wire shape (SPEC §12, §15).

Every one carries the refusal code, a request id header (`request-id` on the Anthropic wire,
`x-request-id` on the OpenAI wire; the attempt id where there is one), `x-should-retry: false`
on 401 and on a refusal no prompt retry can change (`model-not-permitted`, `model-unpriced`,
and `budget-exhausted`, whose reset is hours away rather than seconds), a whole-second
`retry-after` on 429 and on a 503 whose end is known, and `x-leasehold-overhead-ms`.
"""

from __future__ import annotations

from dataplane.attempt import Attempt
from dataplane.wires.spec import WireSpec
from shared.bounds import retry_after_s as retry_after_s_of
from shared.codes import HTTP_STATUS, AttemptStatus, ErrorCode, Refusal
from shared.http1.response import Response

OVERHEAD_HEADER = "x-leasehold-overhead-ms"
# Refusals no retry can change, besides every 401: they say `x-should-retry: false`.
NOT_RETRIED = frozenset(
    {
        Refusal.MODEL_NOT_PERMITTED,
        Refusal.MODEL_UNPRICED,
        Refusal.BUDGET_EXHAUSTED,
        Refusal.INVALID_REQUEST_BODY,
        Refusal.UNSUPPORTED_CONTENT_ENCODING,
        Refusal.ADMINISTRATIVE_DISABLED,  # a socket's handshake on a disabled account (SPEC §20)
    }
)


def refusal_response(
    wire: WireSpec,
    code: Refusal | ErrorCode,
    message: str,
    request_id: str,
    overhead_ms: float,
    *,
    status: int | None = None,
    retry_after_s: float | None = None,
) -> Response:
    status = status or HTTP_STATUS[code]
    body = wire.error_body(status, str(code), message, request_id)
    headers = {wire.request_id_header: request_id}
    headers[OVERHEAD_HEADER] = f"{overhead_ms:.3f}"
    if status == 401 or code in NOT_RETRIED:
        headers["x-should-retry"] = "false"
    if retry_after_s is not None:
        headers["retry-after"] = str(retry_after_s_of(retry_after_s))
    return Response(body=body, status=status, content_type="application/json", headers=headers)


def refuse(
    attempt: Attempt, code: Refusal, message: str, retry_after_s: float | None = None, status: int | None = None
) -> Response:
    """A gateway-authored refusal of an accepted attempt: its row (never evidence) and answer;
    `status` only where the data plane answers a code otherwise than `HTTP_STATUS` does."""
    response = refusal_response(
        attempt.spec,
        code,
        message,
        attempt.attempt_id,
        attempt.mark_overhead(0.0),
        status=status,
        retry_after_s=retry_after_s,
    )
    attempt.finish(AttemptStatus.REFUSED, response.status, refusal=code, retry_after_s=retry_after_s)
    return response
