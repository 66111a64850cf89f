"""A read right after an answer holds its row (issue 27, `controlplane/drain.py`): the data plane
sends a 2xx row lazily (`shared/rpc.LAZY_FLUSH_S`, 10 ms), and every control read and mint first
drains what it holds back, so a worker or an operator asking right after a request finds it in
the views, the spend, the ledger and the budgets. Each of these fails with the drain taken out
(a view then answers before the row arrives)."""

from __future__ import annotations

from tests.support.attempts import A_HEADERS, MESSAGES
from tests.support.harness import Gateway, Stub, http

ROUNDS = 25


def ask(gw: Gateway, token: str) -> None:
    status, _, body = http(
        "POST",
        gw.dataplane_url + "/v1/messages",
        {"model": "claude-sonnet-4-6", "max_tokens": 16, "messages": MESSAGES},
        {**A_HEADERS, "x-api-key": token},
    )
    assert status == 200, body


def test_a_view_right_after_an_answer_holds_its_row(make_gateway, clean_stub: Stub) -> None:
    gw = make_gateway().start()
    minted = gw.mint(repo_slug="acme/drain")
    for n in range(1, ROUNDS + 1):
        ask(gw, minted["token"])
        recent = gw.recent()["routes"]
        assert sum(r["key_id"] == minted["key_id"] for r in recent) == n, f"round {n}: the recent routes lag"
        status, _, spend = gw.api("GET", "/control/v2/spend?window=day&by=repo")
        assert status == 200, spend
        by_repo = {r["key"]: r for r in spend["rows"]}
        assert by_repo["acme/drain"]["attempts"] == n, f"round {n}: the spend lags"
        assert sum(row["key_id"] == minted["key_id"] for row in gw.ledger()) == n  # settled: on disk
    assert gw.active()["count"] == 0
    assert "dataplane_drain_late" not in gw.logs()


def test_a_mint_right_after_a_spend_bearing_request_sees_the_spend(make_gateway, clean_stub: Stub) -> None:
    gw = make_gateway().start()
    for n in range(5):
        repo = f"acme/budget-{n}"
        status, _, body = gw.api(
            "PUT",
            "/control/v2/policy/level",
            {
                "name": f"repo:{repo}",
                "expected_revision": n,
                "document": {"budgets": [{"window": "day", "usd": 0.000001}]},
                "reason": "a budget one request exhausts",
            },
        )
        assert status == 200, body
        ask(gw, gw.mint(repo_slug=repo)["token"])
        status, _, held = gw.api(
            "POST",
            "/control/v1/keys",
            {"provider_binding": "anthropic", "principal_kind": "worker", "principal_id": "w-1", "repo_slug": repo},
        )
        assert status == 503 and held["error"]["code"] == "budget-exhausted", (n, status, held)  # SPEC §18: held
