"""Read views (scope `read`): routes in flight and recent, and the liveness probe."""

from __future__ import annotations

from controlplane.http.appkeys import READS
from controlplane.http.common import int_query, json_response, requires
from controlplane.routebook import view_of
from shared.clock import iso_ms, now_ms
from shared.codes import Scope
from shared.http1 import web

RECENT_LIMIT_MAX = 200


@requires(None)
async def healthz(request: web.Request) -> web.Response:
    link = request.app[READS].link
    return json_response(
        {
            "status": "ok",
            "dataplane_connected": link.connected and link.ready.is_set(),
            "dataplane_pid": link.peer_pid,
            "ledger_ok": request.app[READS].ledger.ok,
        }
    )


@requires(Scope.READ)
async def routes_active(request: web.Request) -> web.Response:
    book = request.app[READS].routes
    rows = sorted(book.active.values(), key=lambda r: r.started_at)
    return json_response(
        {
            "as_of": iso_ms(now_ms()),
            "count": len(rows),
            "routes": [view_of(r) for r in rows],
            "dataplane_connected": request.app[READS].link.connected,
        }
    )


@requires(Scope.READ)
async def routes_recent(request: web.Request) -> web.Response:
    limit = int_query(request, "limit", 50, 1, RECENT_LIMIT_MAX)
    rows, truncated, retained, since = request.app[READS].routes.recent_view(limit)
    return json_response(
        {
            "as_of": iso_ms(now_ms()),
            "limit": limit,
            "routes": [view_of(r) for r in rows],
            "truncated": truncated,
            "retained": retained,
            "evidence_since": since,
        }
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/control/v2/routes/active", routes_active)
    app.router.add_get("/control/v2/routes/recent", routes_recent)
