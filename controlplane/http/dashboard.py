"""`GET /dashboard`: the read-only operator page, served by the control daemon itself.

The page and its script and stylesheet are package data (`controlplane/static/`), read once at
startup; nothing is fetched from anywhere else, and the Content-Security-Policy says so to the
browser (`'self'` only). The page is public; every data call it makes carries the read token the
operator typed, from `sessionStorage`, in an `Authorization` header (the event feed included:
it is read with `fetch` streaming, not `EventSource`, which cannot send headers).
"""

from __future__ import annotations

from pathlib import Path

from controlplane.http.appkeys import ASSETS
from controlplane.http.common import requires
from shared.http1 import web

FILES = {  # file in controlplane/static → content type
    "dashboard.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",  # state and lifecycle (an ES module)
    "source.js": "text/javascript; charset=utf-8",  # the read API and the feed reader
    "render.js": "text/javascript; charset=utf-8",  # data in, DOM out
    "charts.js": "text/javascript; charset=utf-8",  # budgets and spend, drawn as inline SVG
    "fleet.js": "text/javascript; charset=utf-8",  # the fleet section (SPEC §16)
    "headroom.js": "text/javascript; charset=utf-8",  # the accounts' headroom bars (SPEC §22)
    "dashboard.css": "text/css; charset=utf-8",
}
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


# The package's data directory, read as files: the package is always installed as a directory,
# and `importlib.resources` (with the zipfile support it loads) cost control ~1 MiB of RSS.
STATIC = Path(__file__).resolve().parent.parent / "static"


def load_assets() -> dict[str, bytes]:
    return {name: (STATIC / name).read_bytes() for name in FILES}


def _serve(request: web.Request, name: str) -> web.Response:
    return web.Response(body=request.app[ASSETS][name], headers={"Content-Type": FILES[name], **HEADERS})


@requires(None)
async def page(request: web.Request) -> web.Response:
    return _serve(request, "dashboard.html")


@requires(None)
async def asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in FILES or name == "dashboard.html":
        raise web.HTTPNotFound()
    return _serve(request, name)


def add_routes(app: web.Application) -> None:
    app[ASSETS] = load_assets()
    app.router.add_get("/dashboard", page)
    app.router.add_get("/dashboard/{name}", asset)
