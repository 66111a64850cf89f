"""`GET /control/v2/budgets` and `GET /control/v2/spend` in-process over a real socket (the real
control app, a real ledger on disk, the ledger's clock a `FakeClock`): fields exactly as SPEC
§18 spells them, scopes, and 422s naming the parameter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controlplane.main import build_app
from controlplane.service import ControlService
from controlplane.stores.ledger import Ledger
from tests.support.control import close_control, make_control
from tests.support.harness import credential_like
from tests.support.ledgerfiles import FakeClock
from tests.support.rows import row

ADMIN, READ = credential_like("ctl_"), credential_like("read_")
BUDGET_FIELDS = {
    "level",
    "window",
    "usd",
    "spent_usd",
    "remaining_usd",
    "exhausted",
    "window_start",
    "resets_at",
    "overshoot_usd",
    "unpriced_attempts",
}
ROW_FIELDS = {"key", "cost_usd", "attempts", "unpriced_attempts", "usage"}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock("2026-11-30T23:30:00")


@pytest.fixture
def control(tmp_path: Path, clock: FakeClock):
    env = {
        "GATEWAY_STATE_DIR": str(tmp_path / "state"),
        "GATEWAY_RUNTIME_DIR": str(tmp_path / "run"),
        "GATEWAY_CONTROL_TOKEN": ADMIN,
        "GATEWAY_READ_TOKEN": READ,
    }
    (tmp_path / "state").mkdir()
    ledger = Ledger(str(tmp_path / "state" / "ledger.jsonl"), clock=clock)
    ledger.open()
    control = make_control(tmp_path / "state", settings=env, env=env, ledger=ledger)
    yield control
    close_control(control)


@pytest.fixture
def service(control):
    return control.service


@pytest.fixture
async def client(app_client, control):
    return await app_client(build_app(control))


async def call(client, method: str, path: str, body: Any = None, token: str | None = READ) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = await client.request(method, path, json=body, headers=headers)
    return response.status, await response.json()


async def put(client, name: str, document: dict, revision: int) -> None:
    status, body = await call(
        client,
        "PUT",
        "/control/v2/policy/level",
        {"name": name, "expected_revision": revision, "document": document, "reason": "budgets"},
        token=ADMIN,
    )
    assert status == 200, body


def record(service: ControlService, *rows) -> None:
    for r in rows:
        service.record(r)


async def test_the_budgets_view(client, service) -> None:
    await put(
        client,
        "team:payments",
        {
            "repos": ["acme/pay", "acme/ledger"],
            "budgets": [{"window": "day", "usd": 1.0}, {"window": "month", "usd": 100}],
        },
        0,
    )
    await put(client, "repo:acme/pay", {"budgets": [{"window": "day", "usd": 2.0}]}, 1)
    # sonnet: 1M output tokens are $15; the record prices them (cost_usd is the control's, not the row's)
    record(
        service,
        row("2026-11-30T23:00:00.000Z", repo="acme/pay", usage=(0, 50_000, 0, 0)),
        row("2026-11-30T23:10:00.000Z", repo="acme/ledger", usage=(0, 30_000, 0, 0)),
        row("2026-11-30T23:11:00.000Z", repo="acme/ledger", model="claude-house-1"),
        row("2026-11-29T12:00:00.000Z", repo="acme/pay", usage=(0, 1_000_000, 0, 0)),
    )
    status, body = await call(client, "GET", "/control/v2/budgets")
    assert status == 200
    assert (body["as_of"], body["policy_revision"]) == ("2026-11-30T23:30:00.000Z", 2)
    assert all(set(b) == BUDGET_FIELDS for b in body["budgets"])
    got = {(b["level"], b["window"]): b for b in body["budgets"]}
    assert list(got) == [("team:payments", "day"), ("team:payments", "month"), ("repo:acme/pay", "day")]
    team_day = got[("team:payments", "day")]
    assert (
        team_day["spent_usd"],
        team_day["remaining_usd"],
        team_day["exhausted"],
        team_day["overshoot_usd"],
        team_day["unpriced_attempts"],
    ) == (1.2, 0.0, True, 0.2, 1)
    assert (team_day["window_start"], team_day["resets_at"]) == ("2026-11-30T00:00:00.000Z", "2026-12-01T00:00:00.000Z")
    assert got[("team:payments", "month")]["spent_usd"] == 16.2
    assert got[("team:payments", "month")]["resets_at"] == "2026-12-01T00:00:00.000Z"
    repo_day = got[("repo:acme/pay", "day")]
    assert (repo_day["spent_usd"], repo_day["remaining_usd"], repo_day["exhausted"]) == (0.75, 1.25, False)


async def test_the_spend_view(client, service) -> None:
    await put(client, "team:payments", {"repos": ["acme/pay"]}, 0)
    record(
        service,
        row("2026-11-30T23:00:00.000Z", repo="acme/pay", role="reviewer", usage=(10, 20, 30, 40)),
        row("2026-11-30T22:00:00.000Z", repo="solo/x", account="legacy-openai", model="gpt-5", principal="w-2"),
    )
    status, body = await call(client, "GET", "/control/v2/spend?window=hour&by=repo")
    assert status == 200
    assert set(body) == {"window", "by", "window_start", "as_of", "rows"}
    assert (body["window"], body["by"], body["window_start"]) == ("hour", "repo", "2026-11-30T23:00:00.000Z")
    assert [set(r) for r in body["rows"]] == [ROW_FIELDS]
    only = body["rows"][0]
    assert (only["key"], only["attempts"], only["unpriced_attempts"]) == ("acme/pay", 1, 0)
    assert only["usage"] == {
        "input_tokens": 10,
        "output_tokens": 20,
        "cache_read_tokens": 30,
        "cache_creation_tokens": 40,
    }
    expect = {
        "repo": {"acme/pay", "solo/x"},
        "team": {"payments", None},
        "org": {None},
        "account": {"legacy-anthropic", "legacy-openai"},
        "model": {"claude-sonnet-4-6", "gpt-5"},
        "principal": {"w-1", "w-2"},
        "binding": {"acme/pay#reviewer", None},
    }
    for by, keys in expect.items():
        status, body = await call(client, "GET", f"/control/v2/spend?window=day&by={by}")
        assert status == 200 and {r["key"] for r in body["rows"]} == keys, (by, body)
    status, body = await call(client, "GET", "/control/v2/spend")
    assert (body["window"], body["by"]) == ("day", "repo")


async def test_the_hourly_series(client, service, clock) -> None:
    record(
        service,
        row("2026-11-30T23:10:00.000Z", account="legacy-openai", model="gpt-5"),
        row("2026-11-30T21:59:00.000Z"),
        row("2026-11-30T21:00:00.000Z"),
    )
    status, body = await call(client, "GET", "/control/v2/spend?window=hour&by=account&hours=4")
    assert status == 200 and set(body) == {"window", "by", "window_start", "as_of", "rows", "series"}
    assert [(h["window_start"], h["held"], [(r["key"], r["attempts"]) for r in h["rows"]]) for h in body["series"]] == [
        ("2026-11-30T20:00:00.000Z", True, []),
        ("2026-11-30T21:00:00.000Z", True, [("legacy-anthropic", 2)]),
        ("2026-11-30T22:00:00.000Z", True, []),
        ("2026-11-30T23:00:00.000Z", True, [("legacy-openai", 1)]),
    ]
    assert body["series"][-1]["rows"] == body["rows"]  # the hour in progress is the view's own
    clock.set("2026-12-01T01:30:00")  # a new month: the book holds from its start on
    status, body = await call(client, "GET", "/control/v2/spend?window=hour&by=account&hours=3")
    assert [(h["window_start"], h["held"], h["rows"]) for h in body["series"]] == [
        ("2026-11-30T23:00:00.000Z", False, []),
        ("2026-12-01T00:00:00.000Z", True, []),
        ("2026-12-01T01:00:00.000Z", True, []),
    ]


@pytest.mark.parametrize(
    "query,param",
    [
        ("window=week", "window"),
        ("by=dispatch", "by"),
        ("window=DAY", "window"),
        ("window=day&by=", None),
        ("window=day&hours=3", "hours"),
        ("window=hour&hours=0", "hours"),
        ("window=hour&hours=169", "hours"),
        ("window=hour&hours=x", "hours"),
    ],
)
async def test_a_bad_query_value_is_a_422_naming_the_parameter(client, query: str, param: str | None) -> None:
    status, body = await call(client, "GET", f"/control/v2/spend?{query}")
    if param is None:
        assert status == 200
        return
    assert (status, body["error"]["code"], body["error"]["param"]) == (422, "invalid-request", param)
    assert param in body["error"]["message"]


async def test_both_views_need_the_read_scope(client) -> None:
    for path in ("/control/v2/budgets", "/control/v2/spend?window=month&by=team"):
        assert (await call(client, "GET", path, token=None))[0] == 401
        assert (await call(client, "GET", path))[0] == 200


async def test_with_no_budget_the_view_is_empty(client) -> None:
    status, body = await call(client, "GET", "/control/v2/budgets")
    assert (status, body["budgets"], body["policy_revision"]) == (200, [], 0)


async def test_explain_lists_each_budget_of_the_chain_with_its_spend(client, service) -> None:
    await put(client, "team:payments", {"repos": ["acme/pay"], "budgets": [{"window": "day", "usd": 1.0}]}, 0)
    await put(client, "repo:acme/pay", {"budgets": [{"window": "day", "usd": 2.0}]}, 1)
    await put(client, "repo:acme/web", {"budgets": [{"window": "day", "usd": 9.0}]}, 2)
    record(service, row("2026-11-30T23:00:00.000Z", repo="acme/pay", usage=(0, 100_000, 0, 0)))
    status, body = await call(client, "GET", "/control/v2/policy/explain?repo_slug=acme/pay&model=claude-sonnet-4-6")
    assert status == 200
    assert [(b["level"], b["usd"], b["spent_usd"], b["exhausted"]) for b in body["budgets"]] == [
        ("team:payments", 1.0, 1.5, True),
        ("repo:acme/pay", 2.0, 1.5, False),
    ]
    assert all(set(b) == BUDGET_FIELDS for b in body["budgets"])


async def test_an_unbelievable_policy_chain_withholds_what_needs_its_tenancy(client, service, tmp_path: Path) -> None:
    await put(client, "team:payments", {"repos": ["acme/pay"], "budgets": [{"window": "day", "usd": 1.0}]}, 0)
    chain = tmp_path / "state" / "policy.jsonl"
    chain.write_text(chain.read_text().replace("payments", "p4yments"))  # tampered: the hashes no longer hold
    for path in ("/control/v2/budgets", "/control/v2/spend?by=team", "/control/v2/spend?by=org"):
        status, body = await call(client, "GET", path)
        assert (status, body["error"]["code"]) == (503, "policy-unavailable"), path
    assert (await call(client, "GET", "/control/v2/spend?by=account"))[0] == 200
