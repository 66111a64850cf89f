"""The accounts and routes views against real daemons (SPEC §11, seed 002)."""

from __future__ import annotations

import threading
from pathlib import Path

import anthropic
import pytest

from tests.support.harness import Gateway, Stub, http
from tests.support.waits import wait_until

MODEL = "claude-sonnet-4-6"
FIELDS = {
    "id",
    "display_name",
    "provider_binding",
    "upstream_origin",
    "auth_style",
    "credential_env",
    "configured",
    "administrative_state",
    "leased",
    "lease_count",
    "in_flight",
    "in_flight_count",
    "sockets_open",
    "observed",
    "observed_request_count",
    "observed_aborted_count",
    "last_observed_at",
    "circuit",
    "health",
    "health_reason",
    "hosts",
    "rate_limits",
}


def accounts(gw: Gateway, query: str = "") -> dict:
    status, _, body = gw.api("GET", "/control/v2/accounts" + query)
    assert status == 200, body
    return body


def by_id(body: dict) -> dict:
    return {a["id"]: a for a in body["accounts"]}


def call(gw: Gateway, token: str, step: str | None = None, stream: bool = False) -> int:
    headers = {"x-api-key": token, **({"x-stub-step": step} if step else {})}
    body = {"model": MODEL, "max_tokens": 5, "stream": stream, "messages": [{"role": "user", "content": "x"}]}
    return http("POST", gw.dataplane_url + "/v1/messages", body, headers)[0]


def test_every_field_and_an_unconfigured_account_is_named_not_absent(make_gateway, tmp_path: Path, stub: Stub):
    accounts_file = tmp_path / "accounts.toml"
    accounts_file.write_text("""
[[account]]
id = "zz-second"
provider_binding = "openai"
base_url = "https://user:pw@example.test:8443/v1/deep/path"
auth_style = "bearer"
credential_env = "GATEWAY_ZZ_KEY"
models = ["gpt-*"]

[[account]]
id = "aa-third"
provider_binding = "anthropic"
base_url = "https://example.test"
auth_style = "x-api-key"
credential_env = "GATEWAY_AA_KEY"
models = ["claude-*"]
""")
    gw = make_gateway({"GATEWAY_ACCOUNTS_FILE": str(accounts_file), "GATEWAY_ZAI_API_KEY": ""}).start()
    body = accounts(gw)
    assert [a["id"] for a in body["accounts"]] == [
        "legacy-anthropic",
        "legacy-zai-harness",
        "legacy-openai",
        "zz-second",
        "aa-third",
    ]
    for account in body["accounts"]:
        assert set(account) == FIELDS
    view = by_id(body)
    assert view["zz-second"]["upstream_origin"] == "https://example.test:8443"
    assert (view["zz-second"]["configured"], view["zz-second"]["health"], view["zz-second"]["health_reason"]) == (
        False,
        "unverified",
        "credential-missing",
    )
    assert view["legacy-zai-harness"]["configured"] is False
    assert view["legacy-anthropic"]["configured"] is True
    assert (view["legacy-anthropic"]["health"], view["legacy-anthropic"]["health_reason"]) == (
        "unverified",
        "no-evidence",
    )
    assert view["legacy-anthropic"]["circuit"] == {
        "state": "closed",
        "opened_at": None,
        "retry_at": None,
        "opened_by": None,
    }
    assert view["legacy-anthropic"]["rate_limits"] == {}  # no provider answer yet: none reported (SPEC §22)
    assert body["window_seconds"] == 900 and body["evidence_truncated"] is False
    assert body["as_of"].endswith("Z") and body["evidence_since"].endswith("Z")
    # SPEC §16: embedded mode is a fleet of one host, always available
    assert body["fleet"] == {"mode": "embedded", "state": "available", "hosts_live": 1}
    [host] = view["legacy-anthropic"]["hosts"]
    assert set(host) == {"host_id", "lease_count", "in_flight_count", "last_seen_at"}
    assert (host["lease_count"], host["in_flight_count"]) == (0, 0) and host["last_seen_at"].endswith("Z")


def test_three_500s_of_four_is_degraded_and_leases_are_counted(make_gateway, clean_stub: Stub):
    gw = make_gateway().start()
    minted = gw.mint()
    view = by_id(accounts(gw))["legacy-anthropic"]
    assert (view["leased"], view["lease_count"], view["observed"]) == (True, 1, False)
    assert call(gw, minted["token"]) == 200
    for _ in range(3):
        assert call(gw, minted["token"], '{"status": 500}') == 500
    view = by_id(accounts(gw))["legacy-anthropic"]
    assert (view["health"], view["health_reason"]) == ("degraded", "qualifying-failures")
    assert (view["observed_request_count"], view["observed_aborted_count"]) == (4, 0)
    assert view["last_observed_at"] is not None
    # the circuit opened on the third consecutive qualifying terminal
    assert view["circuit"]["state"] == "open" and view["circuit"]["opened_by"] == "upstream-unavailable"


def test_four_aborts_leave_the_account_unverified(make_gateway, clean_stub: Stub):
    gw = make_gateway().start()
    minted = gw.mint()
    for _ in range(4):
        sdk = anthropic.Anthropic(base_url=gw.dataplane_url, api_key=minted["token"], max_retries=0, timeout=0.3)
        with pytest.raises(anthropic.APITimeoutError):
            sdk.messages.create(
                model=MODEL,
                max_tokens=5,
                messages=[{"role": "user", "content": "x"}],
                extra_headers={"x-stub-step": '{"stall_before_headers_s": 3}'},
            )
    wait_until(lambda: len(gw.ledger()) == 4, 10, "four abort rows")
    assert {r["status"] for r in gw.ledger()} == {"client-aborted"}
    view = by_id(accounts(gw))["legacy-anthropic"]
    assert (view["health"], view["health_reason"]) == ("unverified", "only-aborted-evidence")
    assert (view["observed"], view["observed_request_count"], view["observed_aborted_count"]) == (True, 4, 4)


def test_window_and_limit_bounds_are_422_naming_the_bound(gateway: Gateway):
    for query, bound in [("?window_seconds=59", "60"), ("?window_seconds=86401", "86400"), ("?window_seconds=x", "60")]:
        status, _, body = gateway.api("GET", "/control/v2/accounts" + query)
        assert status == 422 and bound in body["error"]["message"] and body["error"]["param"] == "window_seconds"
    for query, bound in [("?limit=0", "1"), ("?limit=201", "200")]:
        status, _, body = gateway.api("GET", "/control/v2/routes/recent" + query)
        assert status == 422 and bound in body["error"]["message"]


def test_recent_view_says_truncated_when_the_limit_cuts(gateway: Gateway, clean_stub: Stub):
    minted = gateway.mint()
    for _ in range(3):
        assert call(gateway, minted["token"]) == 200
    # 2xx rows reach control just after the answer: wait for all three before reading the view
    wait_until(lambda: sum(r["key_id"] == minted["key_id"] for r in gateway.recent()["routes"]) == 3, 10, "three rows")
    body = gateway.api("GET", "/control/v2/routes/recent?limit=2")[2]
    assert len(body["routes"]) == 2 and body["truncated"] is True and body["retained"] >= 3
    body = gateway.api("GET", "/control/v2/routes/recent?limit=200")[2]
    assert body["truncated"] is False and body["retained"] == len(body["routes"])


def test_in_flight_route_is_visible_then_finishes(make_gateway, clean_stub: Stub):
    gw = make_gateway().start()
    minted = gw.mint()
    done = threading.Event()

    def stream() -> None:
        call(gw, minted["token"], '{"stall_after_events": 2, "stall_s": 1.5}', stream=True)
        done.set()

    worker = threading.Thread(target=stream)
    worker.start()
    active = wait_until(lambda: (a := gw.active())["count"] == 1 and a, 10, "route in flight")
    assert active["routes"][0]["key_id"] == minted["key_id"]
    view = by_id(accounts(gw))["legacy-anthropic"]
    assert (view["in_flight"], view["in_flight_count"]) == (True, 1)
    worker.join(20)
    assert done.is_set()
    wait_until(lambda: gw.active()["count"] == 0, 10, "route finished")


def test_a_killed_data_plane_leaves_no_phantom_route(make_gateway, clean_stub: Stub):
    gw = make_gateway().start()
    minted = gw.mint()

    def doomed_stream() -> None:
        try:
            call(gw, minted["token"], '{"stall_after_events": 2, "stall_s": 30}', stream=True)
        except Exception:
            pass

    worker = threading.Thread(target=doomed_stream, daemon=True)
    worker.start()
    wait_until(lambda: gw.active()["count"] == 1, 10, "route in flight")
    gw.dataplane.kill()
    rows = wait_until(lambda: gw.ledger(), 15, "terminal row of the lost route")
    assert len(rows) == 1 and rows[0]["refusal_reason"] == "dataplane-lost" and rows[0]["condition"] is None
    assert gw.active()["count"] == 0
    gw.start_dataplane()
    gw.wait_synchronised()
    assert call(gw, minted["token"]) == 200
