"""The data plane's `GET /healthz` (SPEC §12): no key, never proxied, no row.

200 `{status, control, leases}` while the lease replica is synchronised with control — the
same fact every request depends on (without it the data plane answers 503
`control-unavailable`) — and 503 with `retry-after` while it is not, or while it drains
(SIGTERM: new requests get `gateway-shutdown`). `health_of` is the pure decision.
"""

from __future__ import annotations

import msgspec

from shared.http1.response import Response

HEALTHZ_PATH = "/healthz"
RETRY_AFTER_S = 1
_encode = msgspec.json.Encoder().encode


class Health(msgspec.Struct, frozen=True, kw_only=True):
    status: str  # ok | unavailable | draining
    control: str  # synchronised | connecting | disconnected
    leases: int


def health_of(synchronised: bool, connected: bool, draining: bool, leases: int) -> tuple[int, Health]:
    """The HTTP status and body of `/healthz` for the data plane's facts."""
    control = "synchronised" if synchronised else "connecting" if connected else "disconnected"
    if not synchronised:
        return 503, Health(status="unavailable", control=control, leases=0)
    if draining:
        return 503, Health(status="draining", control=control, leases=leases)
    return 200, Health(status="ok", control=control, leases=leases)


def healthz_response(method: str, status: int, health: Health) -> Response:
    if method not in ("GET", "HEAD"):
        return Response(
            status=405,
            headers={"Allow": "GET, HEAD"},
            content_type="application/json",
            body=b'{"status":"method-not-allowed"}',
        )
    headers = {"Cache-Control": "no-store"}
    if status != 200:
        headers["retry-after"] = str(RETRY_AFTER_S)
    return Response(status=status, body=_encode(health), content_type="application/json", headers=headers)
