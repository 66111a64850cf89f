"""The administrative overlay against real daemons (issue 6 scenario, seed 000 D5)."""

from __future__ import annotations

import json
import os

from tests.support.harness import Gateway, Stub, credential_like, http

MODEL = "claude-sonnet-4-6"


def mint(gw: Gateway, dispatch: str) -> tuple[int, dict]:
    status, _, body = gw.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": dispatch,
            "repo_slug": "acme/app",
            "principal_kind": "worker",
            "principal_id": "w",
            "model": MODEL,
        },
    )
    return status, body


def call(gw: Gateway, token: str) -> int:
    return http(
        "POST",
        gw.dataplane_url + "/v1/messages",
        {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        {"x-api-key": token},
    )[0]


def admin(gw: Gateway, method: str, path: str, body: dict | None = None, token: str = "admin"):
    return gw.api(method, "/control/v2/accounts" + path, body, token=token)


def test_disable_revoke_reenable_and_audit(make_gateway, clean_stub: Stub) -> None:
    gw = make_gateway().start()
    status, live = mint(gw, "d-live")
    assert status == 201
    status, _, body = admin(
        gw,
        "PATCH",
        "/legacy-anthropic/state",
        {"state": "disabled", "reason": "incident 42", "actor": "alice", "expected_revision": 0},
    )
    assert status == 200, body
    status, held = mint(gw, "d-next")
    assert (status, held["refusal_reason"]) == (503, "no-eligible-account")
    assert held["skipped"] == [{"account_id": "legacy-anthropic", "position": 0, "code": "administrative-disabled"}]
    assert call(gw, live["token"]) == 200  # live keys keep working until revoke-leases

    status, _, body = admin(gw, "POST", "/legacy-anthropic/revoke-leases", {"reason": "rotate", "expected_revision": 1})
    assert status == 200 and body["revoked"] >= 1, body
    assert call(gw, live["token"]) == 401

    status, _, body = admin(gw, "PATCH", "/legacy-anthropic/state", {"state": "enabled", "reason": "fixed"})
    assert status == 200
    status, again = mint(gw, "d-after")
    assert status == 201 and again["account_id"] == "legacy-anthropic"

    status, _, audit = admin(gw, "GET", "/audit")
    assert status == 200
    records = audit["records"]
    assert [(r["action"], r.get("state")) for r in records] == [
        ("set-state", "disabled"),
        ("revoke-leases", None),
        ("set-state", "enabled"),
    ] or [r["action"] for r in records] == ["set-state", "revoke-leases", "set-state"]
    assert [r["seq"] for r in records] == [1, 2, 3] or [r["seq"] for r in records] == [0, 1, 2]
    assert records[0]["actor"] == "alice" and records[0]["actor_authenticated_by"] == "control-token"
    assert audit["chain_verdict"] == "verified" and audit["revision"] == 3
    view = gw.api("GET", "/control/v2/accounts")[2]
    assert view["admin_chain_verdict"] == "verified" and view["admin_revision"] == 3


def test_stale_revision_is_409_with_the_current_revision(make_gateway, clean_stub: Stub) -> None:
    gw = make_gateway().start()
    assert admin(gw, "PATCH", "/legacy-openai/state", {"state": "draining", "reason": "r"})[0] == 200
    status, _, body = admin(
        gw, "PATCH", "/legacy-openai/state", {"state": "enabled", "reason": "r", "expected_revision": 0}
    )
    assert status == 409 and body["error"]["current_revision"] == 1


def test_scopes_and_tokens(make_gateway, clean_stub: Stub) -> None:
    read_token, mint_token = credential_like("read_"), credential_like("mint_")
    gw = make_gateway({"GATEWAY_READ_TOKEN": read_token, "GATEWAY_MINT_TOKEN": mint_token}).start()
    change = {"state": "disabled", "reason": "r"}
    assert admin(gw, "PATCH", "/legacy-openai/state", change, token=read_token)[0] == 403
    assert admin(gw, "PATCH", "/legacy-openai/state", change, token=mint_token)[0] == 403
    assert admin(gw, "GET", "/admin", token=read_token)[0] == 200
    assert (
        gw.api(
            "POST",
            "/control/v1/keys",
            {"provider_binding": "anthropic", "principal_kind": "w", "principal_id": "p", "repo_slug": "r"},
            token=read_token,
        )[0]
        == 403
    )
    assert (
        gw.api(
            "POST",
            "/control/v1/keys",
            {"provider_binding": "anthropic", "principal_kind": "w", "principal_id": "p", "repo_slug": "r"},
            token=mint_token,
        )[0]
        == 201
    )


def test_a_tampered_chain_holds_every_mint_and_refuses_mutations(make_gateway, clean_stub: Stub) -> None:
    gw = make_gateway().start()
    assert admin(gw, "PATCH", "/legacy-anthropic/state", {"state": "disabled", "reason": "r"})[0] == 200
    assert admin(gw, "PATCH", "/legacy-anthropic/state", {"state": "enabled", "reason": "r"})[0] == 200
    chain = gw.state_dir / "account-admin.jsonl"
    lines = chain.read_text().splitlines()
    chain.write_text("\n".join(lines[:-1]) + "\n")  # drop the re-enable: the attacker's rollback
    status, held = mint(gw, "d-x")
    assert (status, held["outcome"], held["refusal_reason"]) == (503, "held", "account-state-unavailable")
    status, _, body = admin(gw, "PATCH", "/legacy-anthropic/state", {"state": "enabled", "reason": "r"})
    assert status == 503
    assert gw.api("GET", "/control/v2/accounts")[2]["admin_chain_verdict"] == "corrupt"


def test_chain_writer_on_a_full_disk_refuses_and_recovers(make_gateway, clean_stub: Stub) -> None:
    gw = make_gateway().start()
    assert admin(gw, "PATCH", "/legacy-openai/state", {"state": "draining", "reason": "r"})[0] == 200
    chain = gw.state_dir / "account-admin.jsonl"
    saved = chain.read_bytes()
    chain.unlink()
    os.symlink("/dev/full", chain)
    try:
        status, _, body = admin(gw, "PATCH", "/legacy-openai/state", {"state": "enabled", "reason": "r"})
        assert status >= 500, body
        status, held = mint(gw, "d-y")  # an unreadable chain never reads as 'all enabled'
        assert status == 503 and held["refusal_reason"] == "account-state-unavailable"
    finally:
        chain.unlink()
        chain.write_bytes(saved)
    status, _, body = admin(gw, "PATCH", "/legacy-openai/state", {"state": "enabled", "reason": "r"})
    assert status == 200 and body["revision"] == 2, body
    assert json.loads(chain.read_text().splitlines()[-1])["state"] == "enabled"
