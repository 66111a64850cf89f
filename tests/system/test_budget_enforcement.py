"""Budgets enforced through the real daemons and the real anthropic SDK (SPEC §18).

A budget exhausted by real requests refuses the next request 429 `budget-exhausted` with
`retry-after` and `x-should-retry: false` (the SDK, which obeys it, does not retry), holds the
next mint 503 with `Retry-After`, never cuts a stream already in flight (the overshoot is
published), and holds across a control restart. A model without a price is refused 403
`model-unpriced` where a budget governs, at the mint and at the request, served where none does,
and served everywhere once a prices file prices it. The stub's usage is deterministic, so every
cost is known: 12 input, 3 output, 7 cache-read and 5 cache-write tokens of claude-sonnet-4-6 is
$0.00010185 a request."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.support.attempts import MESSAGES, settled, stub_entry
from tests.support.harness import Gateway, Stub, base_env, http, wait_until
from tests.support.stub_upstream import stub_text

MODEL = "claude-sonnet-4-6"
UNPRICED = "claude-house-1"
PER_REQUEST_USD = 0.00010185
BUDGET_USD = 0.00025  # the third request exhausts it


def put(gw: Gateway, name: str, document: dict) -> None:
    revision = gw.api("GET", "/control/v2/policy")[2]["revision"]
    status, _, body = gw.api(
        "PUT",
        "/control/v2/policy/level",
        {"name": name, "expected_revision": revision, "document": document, "reason": "budget"},
    )
    assert status == 200, body


def mint_v1(gw: Gateway, repo: str) -> tuple[int, dict, Any]:
    return gw.api(
        "POST",
        "/control/v1/keys",
        {"provider_binding": "anthropic", "principal_kind": "worker", "principal_id": "w-1", "repo_slug": repo},
    )


def mint_v2(gw: Gateway, repo: str, model: str = MODEL) -> tuple[int, dict, Any]:
    return gw.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": "d-" + secrets.token_hex(4),
            "repo_slug": repo,
            "principal_kind": "worker",
            "principal_id": "w-1",
            "model": model,
        },
    )


def sdk(gw: Gateway, token: str) -> anthropic.Anthropic:
    """Retries on: the SDK decides by itself, and `x-should-retry: false` must stop it."""
    return anthropic.Anthropic(base_url=gw.dataplane_url, api_key=token, max_retries=2)


def ask(client: anthropic.Anthropic, model: str = MODEL) -> Any:
    return client.messages.create(model=model, max_tokens=16, messages=MESSAGES)


def seconds_to_midnight() -> int:
    return 86_400 - int(time.time()) % 86_400


def gates_pushed(gw: Gateway) -> bool:
    """Control logged an acknowledged push of gates holding at least one lease."""
    for line in gw.control.output().splitlines():
        if '"budget_gates_pushed"' in line:
            entry = json.loads(line)
            if entry["held"] >= 1 and entry["dataplane"]:
                return True
    return False


def feed_events(gw: Gateway, kind: str, count: int) -> list[dict]:
    """The first `count` events of `kind` in control's replay buffer (read from the start)."""
    import urllib.request

    request = urllib.request.Request(
        gw.control_url + "/control/v2/events",
        headers={"Authorization": f"Bearer {gw.control_token}", "Last-Event-ID": "0-0"},
    )
    found: list[dict] = []
    with urllib.request.urlopen(request, timeout=10) as feed:
        event = None
        while len(found) < count:
            line = feed.readline().decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == kind:
                found.append(json.loads(line[6:]))
    return found


def test_an_exhausted_budget_refuses_the_next_request_and_mint_and_never_cuts_a_stream(
    make_gateway, clean_stub: Stub
) -> None:
    gw = make_gateway().start()
    put(gw, "repo:acme/app", {"budgets": [{"window": "day", "usd": BUDGET_USD}]})
    lease = gw.mint()  # v1, acme/app
    client = sdk(gw, lease["token"])
    hold = "budget-" + secrets.token_hex(4)
    streamed: dict[str, Any] = {}

    def stream() -> None:
        step = json.dumps({"hold_after_events": 3, "hold": hold})
        with client.messages.stream(
            model=MODEL, max_tokens=16, messages=MESSAGES, extra_headers={"x-stub-step": step}
        ) as answer:
            streamed["text"] = answer.get_final_text()

    worker = threading.Thread(target=stream)
    worker.start()
    try:
        stub_entry(clean_stub, lambda e: e["stream"] and e["events_sent"] >= 3, what="the stream under way")
        for _ in range(3):  # $0.0003: past the budget while the stream is in flight
            ask(client)
        wait_until(lambda: gates_pushed(gw), 10, "the held gate pushed to the data plane, acknowledged")
        upstream_before = len(clean_stub.requests())
        with pytest.raises(anthropic.RateLimitError) as refused:
            ask(client)
        headers = refused.value.response.headers
        assert headers["x-should-retry"] == "false"
        assert abs(int(headers["retry-after"]) - seconds_to_midnight()) <= 2
        assert refused.value.body["error"]["code"] == "budget-exhausted"
        assert len(clean_stub.requests()) == upstream_before  # no upstream call, and no retry by the SDK

        for status, got, body in (mint_v1(gw, "acme/app"), mint_v2(gw, "acme/app")):
            assert status == 503, body
            assert (body.get("refusal_reason") or body["error"]["code"]) == "budget-exhausted"
            assert abs(int(got["retry-after"]) - seconds_to_midnight()) <= 2
        assert mint_v1(gw, "solo/x")[0] == 201  # another scope is not held
        held = subprocess.run(
            [
                sys.executable,
                "-m",
                "controlplane.ctl",
                "mint",
                "--binding",
                "anthropic",
                "--principal",
                "w-1",
                "--repo",
                "acme/app",
            ],
            capture_output=True,
            text=True,
            env={**base_env(), "GATEWAY_CONTROL_URL": gw.control_url, "GATEWAY_CONTROL_TOKEN": gw.control_token},
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert held.returncode == 3 and "mint held (503 budget-exhausted)" in held.stderr, held.stderr
        assert [r["attempt_id"] for r in gw.active()["routes"] if r["key_id"] == lease["key_id"]]  # still streaming
    finally:
        clean_stub.release(hold)
        worker.join(30)
    assert streamed.get("text") == stub_text(), "the stream in flight was cut"

    rows = settled(gw, lease["key_id"], 5)
    refusals = [r for r in rows if r["status"] == "refused"]
    assert [(r["refusal_reason"], r["http_status"], r["condition"]) for r in refusals] == [
        ("budget-exhausted", 429, None)
    ]
    stream_row = next(r for r in rows if r["stream"])
    assert stream_row["status"] == "completed" and stream_row["cost_usd"] == pytest.approx(PER_REQUEST_USD)
    spent = sum(r["cost_usd"] or 0 for r in rows)
    assert spent == pytest.approx(4 * PER_REQUEST_USD)
    view = gw.api("GET", "/control/v2/budgets")[2]["budgets"]
    assert len(view) == 1 and view[0]["exhausted"]
    assert view[0]["spent_usd"] == pytest.approx(spent) and view[0]["overshoot_usd"] == pytest.approx(
        spent - BUDGET_USD
    )
    circuit = next(a for a in gw.api("GET", "/control/v2/accounts")[2]["accounts"] if a["id"] == "legacy-anthropic")
    assert circuit["circuit"]["state"] == "closed"  # a budget's refusal is never evidence
    assert [(e["level"], e["threshold"]) for e in feed_events(gw, "budget", 2)] == [
        ("repo:acme/app", 80),
        ("repo:acme/app", 100),
    ]

    gw.control.stop()  # the hold survives a control restart
    gw.start_control()
    gw.wait_synchronised()
    with pytest.raises(anthropic.RateLimitError):
        ask(client)
    assert mint_v1(gw, "acme/app")[0] == 503
    settled(gw, lease["key_id"], 6)


def test_an_unpriced_model_is_refused_where_a_budget_governs_and_served_elsewhere_until_priced(
    make_gateway, clean_stub: Stub, tmp_path: Path
) -> None:
    gw = make_gateway().start()
    put(gw, "repo:acme/pay", {"budgets": [{"window": "month", "usd": 100}]})
    status, headers, body = mint_v2(gw, "acme/pay", UNPRICED)
    assert (status, body["outcome"], body["refusal_reason"]) == (403, "rejected", "model-unpriced")
    assert headers["x-should-retry"] == "false"
    assert mint_v2(gw, "solo/x", UNPRICED)[0] == 201  # no budget there: served, counted unpriced

    budgeted, free = gw.mint(repo_slug="acme/pay"), gw.mint(repo_slug="solo/x")
    with pytest.raises(anthropic.PermissionDeniedError) as refused:
        ask(sdk(gw, budgeted["token"]), UNPRICED)
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert refused.value.body["error"]["code"] == "model-unpriced"
    assert ask(sdk(gw, budgeted["token"])).content  # a priced model is served
    assert ask(sdk(gw, free["token"]), UNPRICED).content  # unbudgeted: served
    assert settled(gw, free["key_id"])[0]["cost_reason"] == "unpriced"
    rows = settled(gw, budgeted["key_id"], 2)
    assert [(r["refusal_reason"], r["http_status"]) for r in rows if r["status"] == "refused"] == [
        ("model-unpriced", 403)
    ]
    assert len([e for e in clean_stub.requests() if e["model"] == UNPRICED]) == 1  # only the unbudgeted one went

    prices = tmp_path / "prices.toml"
    prices.write_text(
        '[[price]]\nmodels = ["claude-house-*"]\ninput = 1.0\noutput = 2.0\ncache_read = 0.1\ncache_creation = 1.25\n'
    )
    gw.env["GATEWAY_PRICES_FILE"] = str(prices)
    gw.control.stop()
    gw.start_control()
    gw.wait_synchronised()
    assert ask(sdk(gw, budgeted["token"]), UNPRICED).content  # priced now: served
    assert settled(gw, budgeted["key_id"], 3)[-1]["cost_reason"] == "priced"
    assert mint_v2(gw, "acme/pay", UNPRICED)[0] == 201
    assert http("GET", gw.dataplane_url + "/healthz")[0] == 200
