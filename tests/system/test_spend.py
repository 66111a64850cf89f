"""Budgets and spend through the real daemons (SPEC §18): rows served by the data plane are
spent in their scopes, the views and `leaseholdctl budgets | spend` show it, and it survives a
control restart — including rows only a rotated segment holds."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from controlplane.stores import segments
from tests.support.attempts import A_HEADERS, MESSAGES, one_row
from tests.support.harness import Gateway, Stub, base_env, http, wait_until

CTL = [sys.executable, "-m", "controlplane.ctl"]


def put(gw: Gateway, revision: int, name: str, document: dict) -> None:
    status, _, body = gw.api(
        "PUT",
        "/control/v2/policy/level",
        {"name": name, "expected_revision": revision, "document": document, "reason": "budgets"},
    )
    assert status == 200, body


def serve(gw: Gateway, repo: str, model: str = "claude-sonnet-4-6") -> dict:
    minted = gw.mint(repo_slug=repo)
    status, _, _ = http(
        "POST",
        gw.dataplane_url + "/v1/messages",
        {"model": model, "max_tokens": 16, "messages": MESSAGES},
        {**A_HEADERS, "x-api-key": minted["token"]},
    )
    assert status == 200
    return one_row(gw, minted["key_id"])


def ctl(gw: Gateway, *argv: str) -> subprocess.CompletedProcess:
    env = {**base_env(), "GATEWAY_CONTROL_URL": gw.control_url, "GATEWAY_CONTROL_TOKEN": gw.control_token}
    done = subprocess.run([*CTL, *argv], env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return done


def spend_by(gw: Gateway, by: str, window: str = "day") -> dict:
    status, _, body = gw.api("GET", f"/control/v2/spend?window={window}&by={by}")
    assert status == 200, body
    return {r["key"]: r for r in body["rows"]}


def test_spend_is_counted_shown_and_survives_a_restart(make_gateway, clean_stub: Stub) -> None:
    gw = make_gateway().start()
    # Served before the budgets exist: once they do, nothing unpriced is served in their scope,
    # and the team's budget is exhausted (enforcement: tests/system/test_budget_enforcement.py).
    rows = [
        serve(gw, "acme/pay"),
        serve(gw, "acme/pay"),
        serve(gw, "solo/x"),
        serve(gw, "acme/pay", model="claude-house-1"),
    ]
    put(gw, 0, "team:payments", {"repos": ["acme/pay"], "budgets": [{"window": "day", "usd": 0.0001}]})
    put(gw, 1, "repo:acme/pay", {"budgets": [{"window": "month", "usd": 1000}]})
    assert rows[-1]["cost_reason"] == "unpriced"
    spent = sum(r["cost_usd"] for r in rows[:2])
    by_repo = spend_by(gw, "repo")
    assert (by_repo["acme/pay"]["attempts"], by_repo["acme/pay"]["unpriced_attempts"]) == (3, 1)
    assert abs(by_repo["acme/pay"]["cost_usd"] - spent) < 1e-9
    assert set(spend_by(gw, "team")) == {"payments", None}

    status, _, view = gw.api("GET", "/control/v2/budgets")
    budgets = {(b["level"], b["window"]): b for b in view["budgets"]}
    team = budgets[("team:payments", "day")]
    assert team["exhausted"] and abs(team["overshoot_usd"] - (spent - 0.0001)) < 1e-9
    assert team["unpriced_attempts"] == 1 and not budgets[("repo:acme/pay", "month")]["exhausted"]

    human = ctl(gw, "budgets").stdout
    assert "team:payments" in human and "EXHAUSTED" in human and "unknown, not zero" in human
    assert json.loads(ctl(gw, "budgets", "--json").stdout)["budgets"] == view["budgets"]
    table = ctl(gw, "spend", "--by", "team").stdout
    assert "payments" in table and "(no team)" in table and "TOTAL" in table
    assert json.loads(ctl(gw, "spend", "--window", "month", "--json").stdout)["window"] == "month"

    before = {by: spend_by(gw, by, window) for by in ("repo", "principal") for window in ("hour", "day", "month")}
    gw.control.stop()
    gw.start_control()
    wait_until(lambda: (gw.healthz() or {}).get("dataplane_connected"), 20, "the data plane back")
    after = {by: spend_by(gw, by, window) for by in ("repo", "principal") for window in ("hour", "day", "month")}
    assert after == before


def test_a_restart_reads_the_rotated_segments_of_the_month(make_gateway, clean_stub: Stub) -> None:
    gw = make_gateway()
    gw.state_dir.mkdir(parents=True)
    today = time.strftime("%Y%m%d", time.gmtime())
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
    row = {
        "attempt_id": "att_rotated",
        "key_id": "key_x",
        "account_id": "legacy-anthropic",
        "repo_slug": "acme/old",
        "principal_id": "w-9",
        "served_model": "claude-sonnet-4-6",
        "requested_model": "claude-sonnet-4-6",
        "finished_at": stamp,
        "cost_usd": 1.25,
        "usage": {"input_tokens": 1, "output_tokens": 2, "cache_read_tokens": 0, "cache_creation_tokens": 0},
    }
    (gw.state_dir / f"ledger-{today}.jsonl.part").write_text(json.dumps(row) + "\n")
    segments.finish_rotation(str(gw.state_dir), today)  # as a rotation earlier today left it
    gw.start()
    old = spend_by(gw, "repo")["acme/old"]
    assert (old["cost_usd"], old["attempts"]) == (1.25, 1)
    assert spend_by(gw, "principal", "month")["w-9"]["attempts"] == 1
    rebuilt = [json.loads(line) for line in gw.control.output().splitlines() if '"spend_rebuilt"' in line]
    assert [(e["segments"], e["summaries"]) for e in rebuilt] == [(1, 1)]
