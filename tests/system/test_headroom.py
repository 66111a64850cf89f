"""Provider rate-limit headroom end to end (SPEC §22): real daemons, the stub sending the real
header sets of both providers on 2xx and 429 answers.

What is shown: the headers reach the worker unchanged and the row as `rate_limits`; the accounts
view and `/metrics` publish them; with `min_headroom_percent` set, a low account is skipped
(`rate-limit-headroom-low`, in the mint's skips and in explain's per-candidate codes) until its
reset, then taken again; `headroom` events mark the crossing and the recovery; health stays
evidence-based.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.support.harness import Gateway, credential_like, http
from tests.support.waits import wait_until
from tests.system.test_ctl import ctl
from tests.system.test_events import Feed
from tests.system.test_policy_routing import call, mint, pool, put_level

MODEL = "claude-sonnet-4-6"
LOW = "rate-limit-headroom-low"


def rfc3339(at_s: float) -> str:
    return datetime.fromtimestamp(int(at_s), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def anthropic_headers(tokens_remaining: int, reset_s: float) -> dict[str, str]:
    """What Anthropic sends (every kind), tokens at `tokens_remaining` of 40,000."""
    reset = rfc3339(reset_s)
    return {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-requests-reset": reset,
        "anthropic-ratelimit-tokens-limit": "40000",
        "anthropic-ratelimit-tokens-remaining": str(tokens_remaining),
        "anthropic-ratelimit-tokens-reset": reset,
        "anthropic-ratelimit-input-tokens-limit": "30000",
        "anthropic-ratelimit-input-tokens-remaining": "29000",
        "anthropic-ratelimit-input-tokens-reset": reset,
        "anthropic-ratelimit-output-tokens-limit": "8000",
        "anthropic-ratelimit-output-tokens-remaining": "7900",
        "anthropic-ratelimit-output-tokens-reset": reset,
    }


OPENAI_429 = {
    "x-ratelimit-limit-requests": "500",
    "x-ratelimit-remaining-requests": "0",
    "x-ratelimit-reset-requests": "30s",
    "x-ratelimit-limit-tokens": "30000",
    "x-ratelimit-remaining-tokens": "29000",
    "x-ratelimit-reset-tokens": "6m0s",
    "retry-after": "30",
}


def step(headers: dict[str, str], status: int | None = None) -> str:
    return json.dumps({"headers": headers, **({"status": status} if status else {})})


def account(gw: Gateway, account_id: str) -> dict[str, Any]:
    return next(a for a in gw.api("GET", "/control/v2/accounts")[2]["accounts"] if a["id"] == account_id)


def explain_codes(gw: Gateway, model: str = MODEL) -> dict[str, str | None]:
    status, _, body = gw.api("GET", f"/control/v2/policy/explain?repo_slug=acme/pay&model={model}")
    assert status == 200, body
    return {c["account_id"]: c["code"] for c in body["candidates"]}


def metric_lines(gw: Gateway, prefix: str) -> list[str]:
    text = gw.api("GET", "/metrics")[2]
    return [line for line in text.splitlines() if line.startswith(prefix)]


def test_anthropic_headers_steer_new_mints_until_the_reset(make_gateway, tmp_path: Path, clean_stub) -> None:
    gw = pool(make_gateway, tmp_path, clean_stub, "anthropic-b")
    feed = Feed(gw, gw.control_token)
    try:
        lease = gw.mint()  # v1: legacy-anthropic, the first candidate
        reset_s = time.time() + 8
        sent = anthropic_headers(1500, reset_s)  # tokens at 3.75 %
        status, got, _ = http(
            "POST",
            gw.dataplane_url + "/v1/messages",
            {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
            {"x-api-key": lease["token"], "x-stub-step": step(sent)},
        )
        assert status == 200
        assert {k: got[k] for k in sent} == sent  # passed to the worker unchanged

        row = wait_until(lambda: gw.recent()["routes"], 10, "the row")[0]
        assert row["rate_limits"]["tokens"] == {
            "limit": 40000,
            "remaining": 1500,
            "reset_at": rfc3339(reset_s).replace("Z", ".000Z"),
        }
        assert set(row["rate_limits"]) == {"observed_at", "requests", "tokens", "input_tokens", "output_tokens"}

        view = account(gw, "legacy-anthropic")
        tokens = view["rate_limits"]["tokens"]
        assert (tokens["limit"], tokens["remaining"], tokens["headroom_percent"], tokens["current"]) == (
            40000,
            1500,
            3.8,
            True,
        )
        assert list(view["rate_limits"]) == ["requests", "tokens", "input_tokens", "output_tokens"]
        assert view["health"] == "healthy"  # headroom is its own fact, never evidence
        assert (
            'leasehold_account_ratelimit_remaining{account_id="legacy-anthropic",kind="tokens"} 1500.0'
            in metric_lines(gw, "leasehold_account_ratelimit_remaining")
        )
        assert 'leasehold_account_ratelimit_limit{account_id="legacy-anthropic",kind="requests"} 50.0' in metric_lines(
            gw, "leasehold_account_ratelimit_limit"
        )

        # floor off: nothing is skipped; a v2 dispatch starts on the account
        assert explain_codes(gw)["legacy-anthropic"] is None
        status, running = mint(gw, dispatch_id="d-running")
        assert (status, running["account_id"]) == (201, "legacy-anthropic"), running
        assert put_level(gw, "platform", {"min_headroom_percent": 10}, 0)[0] == 200
        assert explain_codes(gw) == {"legacy-anthropic": LOW, "anthropic-b": None}
        status, steered = mint(gw, dispatch_id="d-steer")
        assert (status, steered["account_id"]) == (201, "anthropic-b"), steered
        assert steered["skipped"] == [{"account_id": "legacy-anthropic", "position": 0, "code": LOW}]
        below = feed.wait_for(lambda evs: any(e["event"] == "headroom" for e in evs), "the headroom event")
        event = next(e["data"] for e in below if e["event"] == "headroom")
        assert (event["account_id"], event["floor_percent"], event["state"], event["kinds"]) == (
            "legacy-anthropic",
            10,
            "below",
            ["tokens"],
        )

        # running dispatches stay where they are (headroom never moves one): leases still serve,
        # and a renewal keeps its account
        assert call(gw, lease["token"]) == 200
        assert call(gw, running["token"]) == 200
        status, _, renewed = gw.api("POST", f"/control/v2/keys/{running['key_id']}/renew", {})
        assert (status, renewed["account_id"]) == (201, "legacy-anthropic"), renewed
        assert gw.revoke(running["key_id"])

        # at the reset the skip lifts by itself, and the recovery is announced
        wait_until(lambda: explain_codes(gw)["legacy-anthropic"] is None, 30, "the skip lifted at the reset")
        assert time.time() >= reset_s - 1
        status, back = mint(gw, dispatch_id="d-back")
        assert (status, back["account_id"], back["skipped"]) == (201, "legacy-anthropic", [])
        feed.wait_for(
            lambda evs: any(e["event"] == "headroom" and e["data"]["state"] == "recovered" for e in evs),
            "the recovery event",
        )
        assert account(gw, "legacy-anthropic")["rate_limits"]["tokens"]["current"] is False
        assert not any(
            'kind="tokens"' in line and "legacy-anthropic" in line
            for line in metric_lines(gw, "leasehold_account_ratelimit_remaining")
        )
    finally:
        feed.close()


def test_openai_429_headers_are_kept_and_hold_the_only_candidate(make_gateway, clean_stub) -> None:
    gw = make_gateway().start()
    lease = gw.mint("openai")
    status, got, _ = http(
        "POST",
        gw.dataplane_url + "/v1/chat/completions",
        {"model": "gpt-5", "messages": [{"role": "user", "content": "x"}]},
        {"Authorization": f"Bearer {lease['token']}", "x-stub-step": step(OPENAI_429, 429)},
    )
    assert status == 429
    assert {k: got[k] for k in OPENAI_429} == OPENAI_429
    view = wait_until(lambda: account(gw, "legacy-openai")["rate_limits"] or None, 10, "the observation")
    assert (view["requests"]["remaining"], view["requests"]["limit"], view["tokens"]["remaining"]) == (0, 500, 29000)
    observed = datetime.fromisoformat(view["requests"]["observed_at"])
    reset = datetime.fromisoformat(view["requests"]["reset_at"])
    assert abs((reset - observed).total_seconds() - 30) < 0.01  # the duration, from the arrival
    assert 'leasehold_account_ratelimit_remaining{account_id="legacy-openai",kind="requests"} 0.0' in metric_lines(
        gw, "leasehold_account_ratelimit_remaining"
    )
    table = ctl(gw, "accounts").stdout.splitlines()
    assert table[0].rstrip().endswith("HEADROOM")
    openai_line = next(line for line in table if line.startswith("legacy-openai"))
    assert f"0% requests, resets {view['requests']['reset_at'][11:19]}Z" in openai_line

    assert put_level(gw, "repo:acme/pay", {"min_headroom_percent": 5}, 0)[0] == 200
    assert explain_codes(gw, "gpt-5") == {"legacy-openai": LOW}
    status, headers, held = gw.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": "d-o",
            "repo_slug": "acme/pay",
            "principal_kind": "worker",
            "principal_id": "w",
            "model": "gpt-5",
        },
    )
    assert (status, held["refusal_reason"], held["skipped"]) == (
        503,
        "no-eligible-account",
        [{"account_id": "legacy-openai", "position": 0, "code": LOW}],
    )
    assert 20 <= int(headers["retry-after"]) <= 31  # until the requests window resets
    # another repo has no floor: the same account serves it
    status, _, other = gw.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": "d-p",
            "repo_slug": "acme/other",
            "principal_kind": "worker",
            "principal_id": "w",
            "model": "gpt-5",
        },
    )
    assert (status, other["account_id"]) == (201, "legacy-openai")


def test_hostile_header_values_are_ignored_and_still_pass(make_gateway, clean_stub) -> None:
    gw = make_gateway({"GATEWAY_READ_TOKEN": credential_like("read_")}).start()
    lease = gw.mint()
    hostile = {
        "anthropic-ratelimit-tokens-limit": "9" * 40,
        "anthropic-ratelimit-tokens-remaining": "-3",
        "anthropic-ratelimit-requests-limit": "lots",
        "anthropic-ratelimit-requests-remaining": "7",
        "anthropic-ratelimit-requests-reset": "9999-12-31T23:59:59Z",
    }
    status, got, _ = http(
        "POST",
        gw.dataplane_url + "/v1/messages",
        {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        {"x-api-key": lease["token"], "x-stub-step": step(hostile)},
    )
    assert status == 200 and {k: got[k] for k in hostile} == hostile
    view = wait_until(lambda: account(gw, "legacy-anthropic")["rate_limits"] or None, 10, "the observation")
    assert view == {
        "requests": {
            "limit": None,
            "remaining": 7,
            "reset_at": None,
            "observed_at": view["requests"]["observed_at"],
            "headroom_percent": None,
            "current": False,
        }
    }


def test_an_anthropic_429_and_an_openai_stream_report_theirs_too(make_gateway, clean_stub) -> None:
    gw = make_gateway().start()
    anthropic_lease, openai_lease = gw.mint(), gw.mint("openai")
    sent = {**anthropic_headers(0, time.time() + 40), "retry-after": "40"}
    status, got, _ = http(
        "POST",
        gw.dataplane_url + "/v1/messages",
        {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        {"x-api-key": anthropic_lease["token"], "x-stub-step": step(sent, 429)},
    )
    assert status == 429 and {k: got[k] for k in sent} == sent
    streamed = {
        "x-ratelimit-limit-tokens": "30000",
        "x-ratelimit-remaining-tokens": "12000",
        "x-ratelimit-reset-tokens": "1m30s",
    }
    status, got, body = http(
        "POST",
        gw.dataplane_url + "/v1/chat/completions",
        {"model": "gpt-5", "stream": True, "messages": [{"role": "user", "content": "x"}]},
        {"Authorization": f"Bearer {openai_lease['token']}", "x-stub-step": step(streamed)},
    )
    assert status == 200 and "[DONE]" in body and {k: got[k] for k in streamed} == streamed

    def both() -> tuple[dict, dict] | None:
        views = {a["id"]: a["rate_limits"] for a in gw.api("GET", "/control/v2/accounts")[2]["accounts"]}
        found = (views["legacy-anthropic"], views["legacy-openai"])
        return found if all(found) else None

    anthropic_view, openai_view = wait_until(both, 10, "both observations")
    assert anthropic_view["tokens"]["remaining"] == 0 and anthropic_view["tokens"]["headroom_percent"] == 0.0
    assert (openai_view["tokens"]["remaining"], openai_view["tokens"]["headroom_percent"]) == (12000, 40.0)
    assert set(openai_view) == {"tokens"}
    rows = {r["account_id"]: r for r in gw.recent()["routes"]}
    assert rows["legacy-anthropic"]["http_status"] == 429 and rows["legacy-anthropic"]["rate_limits"]["requests"]
    assert rows["legacy-openai"]["rate_limits"]["tokens"]["remaining"] == 12000
