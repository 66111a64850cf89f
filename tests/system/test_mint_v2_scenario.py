"""v2 mint end to end: a real 429 through a real two-account pool (seed 000 D4's scenario)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.harness import Gateway, Stub, credential_like, http

MODEL = "claude-sonnet-4-6"


@pytest.fixture
def second_stub(tmp_path: Path):
    upstream = Stub(tmp_path / "stub-b", anthropic_key=credential_like("sk-ant-api03-"), openai_key=None)
    yield upstream
    upstream.stop()


def pool_gateway(make_gateway, tmp_path: Path, second: Stub, extra: dict | None = None) -> Gateway:
    accounts = tmp_path / "accounts.toml"
    accounts.write_text(f'''
[[account]]
id = "anthropic-team-b"
display_name = "Anthropic (team B)"
provider_binding = "anthropic"
base_url = "{second.url}"
auth_style = "x-api-key"
credential_env = "GATEWAY_ANTHROPIC_TEAM_B_KEY"
models = ["claude-*"]
''')
    env = {"GATEWAY_ACCOUNTS_FILE": str(accounts), "GATEWAY_ANTHROPIC_TEAM_B_KEY": second.anthropic_key}
    env.update(extra or {})
    return make_gateway(env).start()


def mint(gw: Gateway, **fields) -> tuple[int, dict, dict]:
    body = {
        "dispatch_id": "d-1",
        "repo_slug": "acme/app",
        "principal_kind": "worker",
        "principal_id": "w-1",
        "model": MODEL,
        **fields,
    }
    status, headers, payload = gw.api("POST", "/control/v2/mint", body)
    return status, headers, payload


def call(gw: Gateway, token: str, step: str | None = None) -> tuple[int, dict, dict]:
    headers = {"x-api-key": token}
    if step:
        headers["x-stub-step"] = step
    return http(
        "POST",
        gw.dataplane_url + "/v1/messages",
        {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        headers,
    )


def live_leases(gw: Gateway) -> int:
    accounts = gw.api("GET", "/control/v2/accounts")[2]["accounts"]
    return sum(a["lease_count"] for a in accounts)


def test_a_429_moves_the_dispatch_to_the_second_account_once(make_gateway, tmp_path, clean_stub, second_stub):
    gw = pool_gateway(make_gateway, tmp_path, second_stub)
    status, _, first = mint(gw)
    assert status == 201, first
    assert (first["outcome"], first["account_id"], first["fallback_position"], first["hop"]) == (
        "selected",
        "legacy-anthropic",
        0,
        0,
    )
    assert first["effective_model"] == MODEL and first["skipped"] == [] and first["policy_revision"] == 0

    status, headers, body = call(gw, first["token"], '{"status": 429, "headers": {"retry-after": "3"}}')
    assert status == 429 and headers["retry-after"] == "3"

    status, headers, held = mint(gw, retry_of_mint_decision_id=first["mint_decision_id"])
    assert (status, held["outcome"], held["refusal_reason"]) == (503, "held", "fallback-lease-still-held")
    assert int(headers["retry-after"]) >= 1
    assert live_leases(gw) == 1

    assert gw.revoke(first["key_id"]) is True
    status, _, second = mint(gw, retry_of_mint_decision_id=first["mint_decision_id"])
    assert status == 201, second
    assert (second["account_id"], second["fallback_position"], second["hop"]) == ("anthropic-team-b", 1, 1)
    assert live_leases(gw) == 1

    second_stub.reset()
    status, _, _ = call(gw, second["token"])
    assert status == 200
    assert len(second_stub.requests()) == 1
    assert second_stub.requests()[0]["headers"]["x-api-key"] == second_stub.anthropic_key

    status, _, _ = call(gw, second["token"], '{"status": 500}')
    assert status == 500
    assert gw.revoke(second["key_id"])
    status, _, again = mint(gw, retry_of_mint_decision_id=second["mint_decision_id"])
    assert (status, again["outcome"], again["refusal_reason"]) == (503, "held", "fallback-budget-exhausted")
    assert live_leases(gw) == 0


def test_citation_refusals_come_before_holds(make_gateway, tmp_path, clean_stub, second_stub):
    gw = pool_gateway(make_gateway, tmp_path, second_stub)
    _, _, first = mint(gw)
    # A different dispatch citing it is inadmissible — rejected even though the lease is still held.
    status, _, body = mint(gw, dispatch_id="d-2", retry_of_mint_decision_id=first["mint_decision_id"])
    assert (status, body["outcome"], body["refusal_reason"]) == (409, "rejected", "fallback-lineage-mismatch")
    status, _, body = mint(gw, retry_of_mint_decision_id="md_unknown")
    assert (status, body["refusal_reason"]) == (503, "fallback-lineage-unknown")
    # No qualifying evidence yet: a retry after revoke is held not-authorised.
    gw.revoke(first["key_id"])
    status, _, body = mint(gw, retry_of_mint_decision_id=first["mint_decision_id"])
    assert (status, body["refusal_reason"]) == (503, "fallback-not-authorised")
    # Supersede (response lost) stays at the same position and spends nothing.
    status, _, body = mint(gw, supersedes_mint_decision_id=first["mint_decision_id"])
    assert status == 201 and body["fallback_position"] == 0 and body["hop"] == 0
    # Once its key reached the upstream, the response was not lost.
    call(gw, body["token"])
    gw.revoke(body["key_id"])
    status, _, again = mint(gw, supersedes_mint_decision_id=body["mint_decision_id"])
    assert (status, again["refusal_reason"]) == (409, "fallback-response-was-not-lost")


def test_body_naming_an_account_is_refused(gateway: Gateway):
    status, _, body = mint(gateway, account_id="legacy-anthropic")
    assert status == 422 and "account_id" in body["error"]["message"]
    status, _, body = mint(gateway, retry_of_mint_decision_id="a", supersedes_mint_decision_id="b")
    assert status == 422


def test_default_registry_is_inert(make_gateway, clean_stub):
    gw = make_gateway().start()
    _, _, first = mint(gw)
    assert first["account_id"] == "legacy-anthropic"
    assert call(gw, first["token"], '{"status": 429}')[0] == 429
    gw.revoke(first["key_id"])
    status, _, body = mint(gw, retry_of_mint_decision_id=first["mint_decision_id"])
    assert (status, body["outcome"], body["refusal_reason"]) == (409, "rejected", "fallback-pool-exhausted")


def test_zero_hops_refuses_every_hop(make_gateway, tmp_path, clean_stub, second_stub):
    gw = pool_gateway(make_gateway, tmp_path, second_stub, {"GATEWAY_MAX_FALLBACK_HOPS": "0"})
    _, _, first = mint(gw)
    assert call(gw, first["token"], '{"status": 529}')[0] == 529
    gw.revoke(first["key_id"])
    status, _, body = mint(gw, retry_of_mint_decision_id=first["mint_decision_id"])
    assert (status, body["refusal_reason"]) == (503, "fallback-budget-exhausted")


def test_credit_exhaustion_opens_the_circuit_and_selection_skips_it(make_gateway, tmp_path, clean_stub, second_stub):
    gw = pool_gateway(make_gateway, tmp_path, second_stub)
    _, _, first = mint(gw)
    assert call(gw, first["token"], '{"status": 402}')[0] == 402
    view = {a["id"]: a for a in gw.api("GET", "/control/v2/accounts")[2]["accounts"]}
    circuit = view["legacy-anthropic"]["circuit"]
    assert circuit["state"] == "open" and circuit["opened_by"] == "credit-exhausted" and circuit["retry_at"]
    # The lease minted before the circuit opened keeps reaching its account.
    assert call(gw, first["token"])[0] == 200
    status, _, other = mint(gw, dispatch_id="d-9")
    assert status == 201 and other["account_id"] == "anthropic-team-b"
    assert other["skipped"] == [{"account_id": "legacy-anthropic", "position": 0, "code": "circuit-open"}]


def test_renew_keeps_account_and_position(make_gateway, tmp_path, clean_stub, second_stub):
    gw = pool_gateway(make_gateway, tmp_path, second_stub)
    _, _, first = mint(gw)
    status, _, renewed = gw.api("POST", f"/control/v2/keys/{first['key_id']}/renew", {})
    assert status == 201, renewed
    assert renewed["account_id"] == first["account_id"]
    assert renewed["fallback_position"] == first["fallback_position"]
    assert renewed["key_id"] != first["key_id"]
    gw.revoke(first["key_id"])
    assert call(gw, renewed["token"])[0] == 200
