"""v2 mint and renew (SPEC §5): `POST /control/v2/mint`, `POST /control/v2/keys/{key_id}/renew`."""

from __future__ import annotations

import msgspec

from controlplane.answers import MintAnswer
from controlplane.http.appkeys import DESK
from controlplane.http.common import json_response, read_json, requires
from controlplane.mintshapes import MintV2
from shared.bounds import TtlSeconds
from shared.codes import ErrorCode, Scope
from shared.errors import GatewayError
from shared.http1 import web
from shared.tokens import KEY_ID_RE


class Renew(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    ttl_seconds: TtlSeconds | None = None


def _answer(answer: MintAnswer) -> web.Response:
    headers = {"Retry-After": str(answer.retry_after_s)} if answer.retry_after_s is not None else {}
    if answer.no_retry:
        headers["x-should-retry"] = "false"
    return json_response(answer.body, status=answer.status, headers=headers or None)


@requires(Scope.MINT)
async def mint_v2(request: web.Request) -> web.Response:
    body = await read_json(request, MintV2)
    return _answer(await request.app[DESK].mint_v2(body))


@requires(Scope.MINT)
async def renew(request: web.Request) -> web.Response:
    key_id = request.match_info["key_id"]
    if not KEY_ID_RE.match(key_id):
        raise GatewayError(ErrorCode.INVALID_REQUEST, "key_id must be a ULID")
    body = await read_json(request, Renew) if request.can_read_body else Renew()
    return _answer(await request.app[DESK].renew(key_id, body.ttl_seconds))


class Extend(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    ttl_seconds: TtlSeconds | None = None


@requires(Scope.MINT)
async def extend(request: web.Request) -> web.Response:
    """SPEC §17: move a dispatch key's expiry forward (to at most `ttl_seconds` from now)."""
    key_id = request.match_info["key_id"]
    if not KEY_ID_RE.match(key_id):
        raise GatewayError(ErrorCode.INVALID_REQUEST, "key_id must be a ULID")
    body = await read_json(request, Extend) if request.can_read_body else Extend()
    return _answer(await request.app[DESK].extend(key_id, body.ttl_seconds))


def add_routes(app: web.Application) -> None:
    app.router.add_post("/control/v2/mint", mint_v2)
    app.router.add_post("/control/v2/keys/{key_id}/renew", renew)
    app.router.add_post("/control/v2/keys/{key_id}/extend", extend)
