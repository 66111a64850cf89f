"""v1 mint and revoke (SPEC §5): `POST /control/v1/keys`, `DELETE /control/v1/keys/{key_id}`."""

from __future__ import annotations

from typing import Annotated, cast

import msgspec

from controlplane.http.appkeys import V1_KEYS
from controlplane.http.common import json_response, read_json, requires
from controlplane.ports import V1Keys
from shared.bounds import TtlSeconds
from shared.clock import iso_ms
from shared.codes import Binding, ErrorCode, Scope
from shared.errors import GatewayError
from shared.http1 import web
from shared.tokens import KEY_ID_RE

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class MintV1(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    provider_binding: Binding
    principal_kind: Name
    principal_id: Name
    repo_slug: Name
    ttl_seconds: TtlSeconds | None = None


def _keys(request: web.Request) -> V1Keys:
    return cast(V1Keys, request.app[V1_KEYS])


@requires(Scope.MINT)
async def mint_v1(request: web.Request) -> web.Response:
    body = await read_json(request, MintV1)
    minted = await _keys(request).mint_v1(
        body.provider_binding, body.principal_kind, body.principal_id, body.repo_slug, body.ttl_seconds
    )
    return json_response(
        {
            "token": minted.token,
            "key_id": minted.lease.key_id,
            "account_id": minted.account.id,
            "expires_at": iso_ms(minted.lease.expires_at_ms),
            "base_url": minted.base_url,
        },
        status=201,
    )


@requires(Scope.MINT)
async def revoke(request: web.Request) -> web.Response:
    key_id = request.match_info["key_id"]
    if not KEY_ID_RE.match(key_id):
        raise GatewayError(ErrorCode.INVALID_REQUEST, "key_id must be a ULID")
    revoked = await _keys(request).revoke(key_id)
    return json_response({"revoked": revoked})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/control/v1/keys", mint_v1)
    app.router.add_delete("/control/v1/keys/{key_id}", revoke)
