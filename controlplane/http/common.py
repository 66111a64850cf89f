"""Shared pieces of the control HTTP surface: scopes, the auth middleware, JSON in and out.

The middleware authenticates the bearer token in constant time **before** any handler runs, so
no body is read for an unauthenticated caller (SPEC §13). Each handler declares its scope with
`@requires(Scope.X)`; admin ⊇ mint ⊇ read.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec

from controlplane.http.appkeys import READS
from shared.bounds import retry_after_s
from shared.capacity import StateUnavailable
from shared.codes import HTTP_STATUS, ErrorCode, Refusal, Scope
from shared.errors import GatewayError
from shared.http1 import web
from shared.logging import get_logger, redact_text
from shared.settings import Settings

log = get_logger("control.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
T = TypeVar("T")

_GRANTS: dict[Scope, frozenset[Scope]] = {
    Scope.ADMIN: frozenset({Scope.ADMIN, Scope.MINT, Scope.READ}),
    Scope.MINT: frozenset({Scope.MINT, Scope.READ}),
    Scope.READ: frozenset({Scope.READ}),
}
SCOPE_KEY = web.RequestKey("scope_of_request", dict) if hasattr(web, "RequestKey") else "scope_of_request"
_encode = msgspec.json.Encoder().encode
# A held caller's wait when the fleet's Redis did not answer: one reply timeout (1 s).
FLEET_RETRY_AFTER_S = 1


def requires(scope: Scope | None, *, drains: bool = True) -> Callable[[Handler], Handler]:
    """Mark a handler with the scope it needs (None = public), and whether its answer first
    drains the data plane's queued reports (`controlplane/drain.py`): every authenticated route
    does unless it says `drains=False` (a stream, the scrape), so a new view cannot forget to."""

    def mark(handler: Handler) -> Handler:
        handler.__leasehold_scope__ = scope  # type: ignore[attr-defined]
        handler.__leasehold_drains__ = drains and scope is not None  # type: ignore[attr-defined]
        return handler

    return mark


class TokenRing:
    """The configured bearer tokens and the scope each grants."""

    def __init__(self, settings: Settings) -> None:
        pairs = [
            (settings.control_token, Scope.ADMIN),
            (settings.mint_token, Scope.MINT),
            (settings.read_token, Scope.READ),
        ]
        self._tokens = [(t.encode(), s) for t, s in pairs if t]

    def scope_of(self, presented: str | None) -> Scope | None:
        if not presented:
            return None
        raw = presented.encode("utf-8", "surrogatepass")
        found: Scope | None = None
        for token, scope in self._tokens:  # compare against every token: no early exit
            if hmac.compare_digest(raw, token) and found is None:
                found = scope
        return found


def bearer_of(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    kind, _, value = header.partition(" ")
    return value.strip() if kind.lower() == "bearer" and value.strip() else None


def error_response(
    code: Refusal | str, message: str, status: int, headers: dict[str, str] | None = None, **extra: Any
) -> web.Response:
    body = {"error": {"code": str(code), "message": message, **extra}}
    return web.Response(body=_encode(body), status=status, content_type="application/json", headers=headers)


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=_encode(payload), status=status, content_type="application/json", headers=headers)


def auth_middleware(ring: TokenRing, metrics_public: bool) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        scope_needed = _scope_needed(request, metrics_public)
        if scope_needed is not None:
            granted = ring.scope_of(bearer_of(request))
            if granted is None:
                log.info("control_auth_refused", path=request.path, method=request.method)
                return error_response(
                    ErrorCode.UNAUTHENTICATED,
                    "a valid bearer token is required",
                    401,
                    headers={"WWW-Authenticate": 'Bearer realm="leasehold"', "Connection": "close"},
                )
            if scope_needed not in _GRANTS[granted]:
                return error_response(
                    ErrorCode.FORBIDDEN_SCOPE,
                    f"this route needs scope {scope_needed!s}; the token grants {granted!s}",
                    403,
                    headers={"Connection": "close"},
                )
            request[SCOPE_KEY] = {"scope": granted}
            await _drain_first(request)
        try:
            return await handler(request)
        except GatewayError as exc:
            headers = {}
            if exc.retry_after_s is not None:
                headers["Retry-After"] = str(retry_after_s(exc.retry_after_s))
            return error_response(exc.code, exc.detail, exc.status, headers=headers, **exc.extra)
        except StateUnavailable as exc:  # fleet mode (SPEC §16): held, never a per-host guess
            log.warning("fleet_state_unavailable", path=request.path, method=request.method, error=str(exc))
            code = Refusal.FLEET_STATE_UNAVAILABLE
            return error_response(
                code,
                "the fleet's shared state (Redis) cannot be reached or answered an error; nothing was changed; retry",
                HTTP_STATUS[code],
                headers={"Retry-After": str(FLEET_RETRY_AFTER_S)},
            )

    return middleware


async def _drain_first(request: web.Request) -> None:
    """The one place a read waits for the rows finished before it (`controlplane/drain.py`)."""
    reads = request.app.get(READS)
    if reads is not None and getattr(request.match_info.route.handler, "__leasehold_drains__", False):
        await reads.drain.drain()


def _scope_needed(request: web.Request, metrics_public: bool) -> Scope | None:
    route = request.match_info.route
    handler = getattr(route, "handler", None)
    marked = getattr(handler, "__leasehold_scope__", "unmarked")
    if marked != "unmarked":
        if request.path == "/metrics" and metrics_public:
            return None
        return marked  # type: ignore[return-value]
    # Unknown routes under /control answer only to an authenticated caller.
    return Scope.READ if request.path.startswith("/control") else None


# What `actor_authenticated_by` records: the configured token that authenticated a mutation
# (the caller's `actor` is only its claim).
AUTHENTICATED_BY: dict[Scope, str] = {Scope.ADMIN: "control-token", Scope.MINT: "mint-token", Scope.READ: "read-token"}


def authenticated_by(request: web.Request) -> str:
    scope = granted_scope(request)
    if scope is None:  # unreachable behind the middleware: a mutation always needs a token
        raise GatewayError(ErrorCode.UNAUTHENTICATED, "a valid bearer token is required")
    return AUTHENTICATED_BY[scope]


def refuse_secret_shapes(**fields: str | None) -> None:
    """Free text lands in a chain kept forever: refuse anything credential-shaped."""
    for name, value in fields.items():
        if value is not None and redact_text(value) != value:
            raise GatewayError(
                ErrorCode.INVALID_REQUEST,
                f"{name} looks like it contains a credential or token; it is recorded forever, so it is refused",
                extra={"field": name},
            )


def granted_scope(request: web.Request) -> Scope | None:
    info = request.get(SCOPE_KEY)
    return None if info is None else info["scope"]


async def read_json(request: web.Request, kind: type[T]) -> T:
    """Decode the body strictly into `kind`; a bad body is a 422 naming what is wrong."""
    if request.content_type not in ("application/json", ""):
        raise GatewayError(ErrorCode.INVALID_REQUEST, "the body must be application/json", status=415)
    body = await request.read()
    try:
        return msgspec.json.decode(body or b"{}", type=kind)
    except msgspec.ValidationError as exc:
        raise GatewayError(ErrorCode.INVALID_REQUEST, f"invalid body: {exc}") from None
    except msgspec.DecodeError:
        raise GatewayError(ErrorCode.INVALID_REQUEST, "the body is not valid JSON") from None


def int_query(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise GatewayError(
            ErrorCode.INVALID_REQUEST,
            f"{name} must be an integer in {lo}..{hi}",
            extra={"param": name, "min": lo, "max": hi},
        ) from None
    if not lo <= value <= hi:
        raise GatewayError(
            ErrorCode.INVALID_REQUEST,
            f"{name}={value} is outside {lo}..{hi}",
            extra={"param": name, "min": lo, "max": hi},
        )
    return value
