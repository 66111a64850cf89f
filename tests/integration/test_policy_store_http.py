"""The policy routes in-process over a real socket (shared.http1's server, the real control app):
scopes, the PUT contract, 422s naming what they refuse, the `policy` event, level and audit reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from controlplane.main import build_app
from tests.support.control import close_control, make_control
from tests.support.harness import credential_like

ADMIN, READ, MINT = credential_like("ctl_"), credential_like("read_"), credential_like("mint_")


@pytest.fixture
def control(tmp_path: Path):
    env = {
        "GATEWAY_STATE_DIR": str(tmp_path / "state"),
        "GATEWAY_RUNTIME_DIR": str(tmp_path / "run"),
        "GATEWAY_CONTROL_TOKEN": ADMIN,
        "GATEWAY_READ_TOKEN": READ,
        "GATEWAY_MINT_TOKEN": MINT,
        "GATEWAY_ANTHROPIC_API_KEY": credential_like("sk-ant-api03-"),
    }
    wired = make_control(tmp_path / "state", settings=env, env=env)
    yield wired
    close_control(wired)


@pytest.fixture
def service(control):
    return control.service


@pytest.fixture
async def client(app_client, control):
    return await app_client(build_app(control))


async def call(client, method: str, path: str, body: Any = None, token: str = ADMIN) -> tuple[int, Any]:
    response = await client.request(method, path, json=body, headers={"Authorization": f"Bearer {token}"})
    return response.status, await response.json()


def level(name: str, document: dict, expected: int, **more: Any) -> dict:
    return {"name": name, "expected_revision": expected, "document": document, "reason": "issue 7", **more}


async def test_put_needs_admin_and_reads_need_read(client) -> None:
    for token in (READ, MINT):
        status, body = await call(client, "PUT", "/control/v2/policy/level", level("platform", {}, 0), token)
        assert (status, body["error"]["code"]) == (403, "forbidden-scope")
    for path in (
        "/control/v2/policy",
        "/control/v2/policy/level?name=platform",
        "/control/v2/policy/audit",
        "/control/v2/policy/explain?repo_slug=acme/app&model=claude-sonnet-4-6",
    ):
        assert (await call(client, "GET", path, token=READ))[0] == 200
        response = await client.get(path)
        assert response.status == 401


async def test_a_write_answers_its_revision_publishes_an_event_and_reads_back(client, service) -> None:
    status, body = await call(
        client,
        "PUT",
        "/control/v2/policy/level",
        level("team:payments", {"repos": ["acme/pay"], "max_fallback_hops": 0}, 0, actor="alice"),
    )
    assert status == 200, body
    assert (body["name"], body["revision"], body["based_on_revision"]) == ("team:payments", 1, 0)
    assert body["record"]["actor_authenticated_by"] == "control-token" and body["record"]["actor"] == "alice"
    events = [e for e in service.events.replay if e.kind == "policy"]
    assert [(e.data.name, e.data.revision) for e in events] == [("team:payments", 1)]

    status, got = await call(client, "GET", "/control/v2/policy/level?name=team:payments", token=READ)
    assert (got["document"], got["written_at_revision"], got["revision"]) == (
        {"repos": ["acme/pay"], "max_fallback_hops": 0},
        1,
        1,
    )
    status, absent = await call(client, "GET", "/control/v2/policy/level?name=repo:acme/pay", token=READ)
    assert (status, absent["document"]) == (200, None)
    status, whole = await call(client, "GET", "/control/v2/policy", token=READ)
    assert whole["levels"] == {"team:payments": {"repos": ["acme/pay"], "max_fallback_hops": 0}}
    assert whole["tenancy"] == {"repos": {"acme/pay": "payments"}, "teams": {}}
    assert (whole["revision"], whole["chain_verdict"]) == (1, "verified")

    await call(client, "PUT", "/control/v2/policy/level", level("platform", {"max_fallback_hops": 1}, 1))
    status, audit = await call(client, "GET", "/control/v2/policy/audit?name=platform", token=READ)
    assert [r["seq"] for r in audit["records"]] == [2] and audit["revision"] == 2


async def test_budgets_are_written_read_back_and_audited_like_every_field(client) -> None:
    document = {"repos": ["acme/pay"], "budgets": [{"window": "day", "usd": 50.0}, {"window": "month", "usd": 900.0}]}
    status, body = await call(client, "PUT", "/control/v2/policy/level", level("team:payments", document, 0))
    assert (status, body["document"]) == (200, document)
    status, got = await call(client, "GET", "/control/v2/policy/level?name=team:payments", token=READ)
    assert got["document"] == document
    status, audit = await call(client, "GET", "/control/v2/policy/audit?name=team:payments", token=READ)
    assert [r["document"]["budgets"] for r in audit["records"]] == [document["budgets"]]
    assert audit["chain_verdict"] == "verified"


async def test_a_stale_revision_is_409_with_the_current_one(client) -> None:
    await call(client, "PUT", "/control/v2/policy/level", level("platform", {}, 0))
    status, body = await call(client, "PUT", "/control/v2/policy/level", level("platform", {}, 0))
    assert status == 409
    assert (body["error"]["code"], body["error"]["current_revision"]) == ("revision-conflict", 1)


@pytest.mark.parametrize(
    "body, named",
    [
        (level("platform", {"account_order": ["legacy-anthropic", "ghost"]}, 0), ["ghost"]),
        (level("platform", {"providers": ["vertex"], "fallback_on": ["budget"]}, 0), ["vertex", "budget"]),
        (level("org:acme", {"teams": ["t"], "locks": ["teams"], "surprise": 1}, 0), ["surprise", "teams"]),
        (level("nowhere", {}, 0), ["nowhere"]),
        (
            level(
                "team:t",
                {
                    "budgets": [{"window": "week", "usd": 5}, {"window": "day", "usd": 0}, {"window": "day", "usd": 3}],
                    "locks": ["budgets"],
                },
                0,
            ),
            ["week", "day", "day", "budgets"],
        ),
    ],
)
async def test_refusals_are_422_and_name_what_they_refuse(client, body: dict, named: list[str]) -> None:
    status, answer = await call(client, "PUT", "/control/v2/policy/level", body)
    assert (status, answer["error"]["code"]) == (422, "invalid-request")
    problems = answer["error"]["problems"]
    assert sorted(n for p in problems for n in p["names"]) == sorted(named)
    assert all(name in answer["error"]["message"] for name in named)
    assert (await call(client, "GET", "/control/v2/policy", token=READ))[1]["revision"] == 0


async def test_the_body_is_strict(client) -> None:
    status, _ = await call(
        client, "PUT", "/control/v2/policy/level", {"name": "platform", "document": {}, "reason": "x"}
    )
    assert status == 422  # expected_revision is required
    status, _ = await call(client, "PUT", "/control/v2/policy/level", level("platform", {}, 0, account_id="x"))
    assert status == 422


async def test_credential_shaped_text_is_never_recorded(client, tmp_path: Path) -> None:
    secret = credential_like("sk-ant-api03-")
    status, body = await call(
        client,
        "PUT",
        "/control/v2/policy/level",
        level("platform", {"model_classes": {"top": {"anthropic": secret}}}, 0),
    )
    assert status == 422 and body["error"]["field"] == "document"
    status, body = await call(client, "PUT", "/control/v2/policy/level", {**level("platform", {}, 0), "reason": secret})
    assert status == 422 and body["error"]["field"] == "reason"
    assert not (tmp_path / "state" / "policy.jsonl").exists()


async def test_explain_is_a_dry_run(client, service) -> None:
    status, body = await call(
        client, "GET", "/control/v2/policy/explain?repo_slug=acme/app&worker_role=r&model=claude-sonnet-4-6", token=READ
    )
    assert status == 200, body
    assert [(c["account_id"], c["code"], c["filters"]) for c in body["candidates"]] == [("legacy-anthropic", None, [])]
    assert body["would_select"]["outcome"] == "selected"
    status, body = await call(client, "GET", "/control/v2/policy/explain?repo_slug=acme/app&model=gpt-5", token=READ)
    assert [(c["account_id"], c["code"], c["filters"]) for c in body["candidates"]] == [
        ("legacy-openai", "not-configured", ["not-configured"])
    ]
    assert (body["would_select"]["outcome"], body["would_select"]["refusal_reason"]) == ("held", "no-eligible-account")
    assert await service.lease_capacity.holds("anything") is False and not service.keys.all()
    for query in ("repo_slug=acme/app", "model=x", "repo_slug=a&model=x&model_class=y"):
        assert (await call(client, "GET", f"/control/v2/policy/explain?{query}", token=READ))[0] == 422
    json.dumps(body)  # plain JSON all the way down
