"""The admin overlay routes over a real loopback socket, behind the real auth middleware."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from controlplane.http.admin import add_routes
from controlplane.http.common import TokenRing, auth_middleware
from controlplane.stores.admin import CHAIN_FILE, AccountAdminStore
from shared.http1 import web
from shared.settings import load_settings
from tests.support.http1 import AppClient

ADMIN, MINT, READ = "ctl-" + "a" * 24, "mint-" + "b" * 24, "read-" + "c" * 24
ACCOUNTS = ("legacy-anthropic", "legacy-zai-harness", "legacy-openai", "team-b")
STATE = "/control/v2/accounts/{}/state"
REVOKE = "/control/v2/accounts/{}/revoke-leases"

Client = Callable[..., Awaitable[AppClient]]


class Revocations:
    """The control service's account-wide revocation, as the routes see it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def __call__(self, account_id: str) -> int:
        self.calls.append(account_id)
        return 3


@pytest.fixture
def revocations() -> Revocations:
    return Revocations()


@pytest.fixture
async def client(tmp_path: Path, app_client: Client, revocations: Revocations) -> AppClient:
    settings = load_settings(
        {
            "GATEWAY_CONTROL_TOKEN": ADMIN,
            "GATEWAY_MINT_TOKEN": MINT,
            "GATEWAY_READ_TOKEN": READ,
            "GATEWAY_STATE_DIR": str(tmp_path),
        }
    )
    app = web.Application(middlewares=[auth_middleware(TokenRing(settings), False)])
    add_routes(app, AccountAdminStore(settings.state_dir, ACCOUNTS), revocations)
    return await app_client(app)


def auth(token: str | None) -> dict[str, str]:
    return {} if token is None else {"Authorization": f"Bearer {token}"}


async def call(
    client: AppClient, method: str, path: str, body: Any = None, token: str | None = ADMIN
) -> tuple[int, Any]:
    response = await client.request(method, path, json=body, headers=auth(token))
    return response.status, await response.json()


def lines(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / CHAIN_FILE
    return [json.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


# ---- scopes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PATCH", STATE.format("team-b"), {"state": "disabled", "reason": "r"}),
        ("POST", REVOKE.format("team-b"), {"reason": "r"}),
    ],
    ids=["set-state", "revoke-leases"],
)
async def test_mutations_need_the_admin_scope(
    client: AppClient, tmp_path: Path, revocations: Revocations, method: str, path: str, body: dict[str, Any]
) -> None:
    assert (await call(client, method, path, body, token=None))[0] == 401
    assert (await call(client, method, path, body, token="wrong-" + "z" * 20))[0] == 401
    for token in (MINT, READ):
        status, payload = await call(client, method, path, body, token=token)
        assert (status, payload["error"]["code"]) == (403, "forbidden-scope")
    assert lines(tmp_path) == [] and revocations.calls == []
    assert (await call(client, method, path, body))[0] == 200


@pytest.mark.parametrize("path", ["/control/v2/accounts/admin", "/control/v2/accounts/audit"])
async def test_reads_need_the_read_scope(client: AppClient, path: str) -> None:
    assert (await call(client, "GET", path, token=None))[0] == 401
    for token in (READ, MINT, ADMIN):
        assert (await call(client, "GET", path, token=token))[0] == 200


# ---- set-state ----------------------------------------------------------------------------------


async def test_set_state_records_the_actor_and_the_token_that_authenticated(client: AppClient, tmp_path: Path) -> None:
    status, done = await call(
        client,
        "PATCH",
        STATE.format("team-b"),
        {"state": "disabled", "reason": "incident 7", "actor": "alice@ops", "expected_revision": 0},
    )
    assert status == 200
    assert (done["revision"], done["based_on_revision"], done["revision_checked"]) == (1, 0, True)
    assert "note" not in done
    (record,) = lines(tmp_path)
    assert record == done["record"]
    assert set(record) == {
        "seq",
        "prev_hash",
        "hash",
        "at",
        "actor",
        "actor_authenticated_by",
        "account_id",
        "action",
        "state",
        "reason",
    }
    assert (record["actor"], record["actor_authenticated_by"]) == ("alice@ops", "control-token")
    assert (record["action"], record["state"], record["reason"]) == ("set-state", "disabled", "incident 7")
    stored = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert not any(t.encode() in stored for t in (ADMIN, MINT, READ))

    status, view = await call(client, "GET", "/control/v2/accounts/admin", token=READ)
    assert (view["revision"], view["chain_verdict"], view["chain_reason"]) == (1, "verified", None)
    assert view["overlay"] == {"team-b": "disabled"}
    assert {a["id"]: a["administrative_state"] for a in view["accounts"]} == {
        "legacy-anthropic": "enabled",
        "legacy-zai-harness": "enabled",
        "legacy-openai": "enabled",
        "team-b": "disabled",
    }


async def test_without_expected_revision_it_applies_at_the_current_one_and_says_so(
    client: AppClient, tmp_path: Path
) -> None:
    await call(client, "PATCH", STATE.format("team-b"), {"state": "draining", "reason": "r"})
    status, done = await call(client, "PATCH", STATE.format("team-b"), {"state": "enabled", "reason": "r"})
    assert status == 200
    assert (done["revision"], done["based_on_revision"], done["expected_revision"]) == (2, 1, None)
    assert done["revision_checked"] is False and "current revision 1" in done["note"]
    assert done["record"]["actor"] is None  # no actor claimed, none invented


async def test_a_stale_expected_revision_is_409_with_the_current_revision(client: AppClient, tmp_path: Path) -> None:
    await call(client, "PATCH", STATE.format("team-b"), {"state": "disabled", "reason": "r"})
    status, refused = await call(
        client, "PATCH", STATE.format("team-b"), {"state": "enabled", "reason": "r", "expected_revision": 0}
    )
    assert status == 409
    assert refused["error"]["code"] == "revision-conflict"
    assert (refused["error"]["current_revision"], refused["error"]["expected_revision"]) == (1, 0)
    assert len(lines(tmp_path)) == 1


async def test_two_concurrent_patches_at_one_revision_exactly_one_commits(client: AppClient, tmp_path: Path) -> None:
    bodies = [
        {"state": "disabled", "reason": "a", "expected_revision": 0},
        {"state": "draining", "reason": "b", "expected_revision": 0},
    ]
    results = await asyncio.gather(*(call(client, "PATCH", STATE.format("team-b"), b) for b in bodies))
    assert sorted(status for status, _ in results) == [200, 409]
    loser = next(payload for status, payload in results if status == 409)
    assert loser["error"]["current_revision"] == 1
    assert len(lines(tmp_path)) == 1


@pytest.mark.parametrize(
    "body",
    [
        {"state": "paused", "reason": "r"},
        {"state": "disabled"},
        {"state": "disabled", "reason": ""},
        {"state": "disabled", "reason": "r", "expected_revision": -1},
        {"state": "disabled", "reason": "r", "account_id": "legacy-openai"},
        {"state": "disabled", "reason": "r", "actor": ""},
        {"state": "disabled", "reason": "pasted sk-ant-api03-abcdefghijklmnopqrstuvwxyz by mistake"},
        {"state": "disabled", "reason": "r", "actor": "token=" + "q" * 20},
    ],
    ids=[
        "unknown-state",
        "no-reason",
        "empty-reason",
        "negative-revision",
        "unknown-field",
        "empty-actor",
        "credential-in-reason",
        "token-in-actor",
    ],
)
async def test_a_bad_body_is_422_and_records_nothing(client: AppClient, tmp_path: Path, body: dict[str, Any]) -> None:
    status, refused = await call(client, "PATCH", STATE.format("team-b"), body)
    assert (status, refused["error"]["code"]) == (422, "invalid-request")
    assert lines(tmp_path) == []


async def test_an_unknown_account_is_404(client: AppClient, tmp_path: Path) -> None:
    status, refused = await call(client, "PATCH", STATE.format("nobody"), {"state": "disabled", "reason": "r"})
    assert (status, refused["error"]["code"]) == (404, "not-found")
    status, refused = await call(client, "POST", REVOKE.format("nobody"), {"reason": "r"})
    assert status == 404 and lines(tmp_path) == []


# ---- revoke-leases --------------------------------------------------------------------------------


async def test_revoke_leases_revokes_then_records(client: AppClient, tmp_path: Path, revocations: Revocations) -> None:
    status, done = await call(
        client, "POST", REVOKE.format("legacy-openai"), {"reason": "key leaked", "actor": "bob", "expected_revision": 0}
    )
    assert status == 200 and done["revoked"] == 3 and revocations.calls == ["legacy-openai"]
    (record,) = lines(tmp_path)
    assert (record["action"], record["state"]) == ("revoke-leases", None)
    assert record["account_id"] == "legacy-openai"
    status, refused = await call(
        client, "POST", REVOKE.format("legacy-openai"), {"reason": "again", "expected_revision": 0}
    )
    assert status == 409 and revocations.calls == ["legacy-openai"]  # stale: nothing revoked


# ---- the audit and a corrupt chain ----------------------------------------------------------------


async def test_audit_lists_every_record_in_order_with_the_verdict(client: AppClient) -> None:
    for state in ("disabled", "enabled"):
        await call(client, "PATCH", STATE.format("team-b"), {"state": state, "reason": state})
    await call(client, "POST", REVOKE.format("team-b"), {"reason": "sweep"})
    status, audit = await call(client, "GET", "/control/v2/accounts/audit", token=READ)
    assert status == 200
    assert (audit["chain_verdict"], audit["chain_reason"], audit["revision"]) == ("verified", None, 3)
    assert [(r["seq"], r["action"], r["state"]) for r in audit["records"]] == [
        (1, "set-state", "disabled"),
        (2, "set-state", "enabled"),
        (3, "revoke-leases", None),
    ]


async def test_a_corrupt_chain_is_reported_and_refuses_mutations(
    client: AppClient, tmp_path: Path, revocations: Revocations
) -> None:
    await call(client, "PATCH", STATE.format("team-b"), {"state": "disabled", "reason": "r"})
    await call(client, "PATCH", STATE.format("legacy-openai"), {"state": "disabled", "reason": "r"})
    chain = tmp_path / CHAIN_FILE
    chain.write_bytes(chain.read_bytes().splitlines(keepends=True)[0])  # drop the last record

    status, view = await call(client, "GET", "/control/v2/accounts/admin", token=READ)
    assert status == 200
    assert (view["chain_verdict"], view["chain_reason"], view["revision"]) == ("corrupt", "shorter-than-anchor", None)
    assert view["overlay"] is None and {a["administrative_state"] for a in view["accounts"]} == {None}
    status, audit = await call(client, "GET", "/control/v2/accounts/audit", token=READ)
    assert (audit["chain_verdict"], len(audit["records"])) == ("corrupt", 1)

    for method, path, body in (
        ("PATCH", STATE.format("legacy-openai"), {"state": "enabled", "reason": "r"}),
        ("POST", REVOKE.format("team-b"), {"reason": "r"}),
    ):
        status, refused = await call(client, method, path, body)
        assert (status, refused["error"]["code"]) == (503, "account-state-unavailable")
        assert refused["error"]["chain_reason"] == "shorter-than-anchor"
    assert revocations.calls == [] and len(chain.read_bytes().splitlines()) == 1
