"""`GET /metrics` (scope `read`; public when `GATEWAY_METRICS_PUBLIC=1`): Prometheus exposition.

The auth middleware (`http/common.py`) exempts exactly this path when the setting is on; the
handler itself only renders the app's own registry, in the format the scraper's `Accept` asks for
(text 0.0.4 by default, OpenMetrics when requested).
"""

from __future__ import annotations

from controlplane.http.appkeys import METRICS
from controlplane.http.common import requires
from controlplane.metrics import GatewayMetrics
from shared.codes import Scope
from shared.http1 import web


@requires(Scope.READ, drains=False)
async def metrics(request: web.Request) -> web.Response:
    gateway_metrics = request.app[METRICS]
    await gateway_metrics.refresh()
    body, content_type = gateway_metrics.exposition(request.headers.get("Accept"))
    return web.Response(body=body, headers={"Content-Type": content_type, "Cache-Control": "no-store"})


def add_routes(app: web.Application, gateway_metrics: GatewayMetrics) -> None:
    app[METRICS] = gateway_metrics
    app.router.add_get("/metrics", metrics)
