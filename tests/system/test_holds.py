"""A key's life never outlasts a hold (SPEC §19), with the real daemons in embedded mode.

Renewal (§5) and a dispatch key's `extend` (§17) pass every hold the mint passes, through
`decide_mint`: an account disabled or draining (409 rejected `administrative-disabled` /
`administrative-draining`), a corrupt policy or admin chain (503 held `policy-unavailable` /
`account-state-unavailable`), an exhausted budget (503 held `budget-exhausted`). A refused
renewal or extension leaves the key's expiry as it was (the key journal says so). The circuit
does not apply to a key that already holds its slot: a renewal on an open circuit is served.
The fleet's Redis paused is `tests/hostile/test_holds_fleet.py`.
"""

from __future__ import annotations

import json
from typing import Any

from tests.support.harness import Gateway, Stub, http

MODEL = "claude-sonnet-4-6"
BODY = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}


def mint(gw: Gateway, dispatch: str, driver: str = "gateway") -> dict[str, Any]:
    status, _, body = gw.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": dispatch,
            "repo_slug": "acme/app",
            "principal_kind": "worker",
            "principal_id": "w-1",
            "model": MODEL,
            "fallback_driver": driver,
        },
    )
    assert status == 201, body
    return body


def renew(gw: Gateway, key_id: str) -> tuple[int, dict[str, str], dict[str, Any]]:
    return gw.api("POST", f"/control/v2/keys/{key_id}/renew", {})


def extend(gw: Gateway, key_id: str) -> tuple[int, dict[str, str], dict[str, Any]]:
    return gw.api("POST", f"/control/v2/keys/{key_id}/extend", {"ttl_seconds": 7200})


def expiry_on_disk(gw: Gateway, key_id: str) -> int:
    """The key's expiry as the key journal last wrote it."""
    expiry = None
    for line in (gw.state_dir / "keys.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry["op"] == "add" and entry["lease"]["key_id"] == key_id:
            expiry = entry["lease"]["expires_at_ms"]
    assert expiry is not None
    return expiry


def set_state(gw: Gateway, state: str) -> None:
    status, _, body = gw.api("PATCH", "/control/v2/accounts/legacy-anthropic/state", {"state": state, "reason": "r"})
    assert status == 200, body


def assert_refused(answer: tuple[int, dict[str, str], dict[str, Any]], status: int, outcome: str, reason: str) -> None:
    got, headers, body = answer
    assert (got, body.get("outcome"), body.get("refusal_reason")) == (status, outcome, reason), body
    assert ("retry-after" in headers) == (status == 503)


def assert_both_refused(gw: Gateway, keyed: dict, caller: dict, status: int, outcome: str, reason: str) -> None:
    """The dispatch key's extension and the caller's renewal refused alike; neither expiry moved."""
    before = expiry_on_disk(gw, keyed["key_id"]), expiry_on_disk(gw, caller["key_id"])
    assert_refused(extend(gw, keyed["key_id"]), status, outcome, reason)
    assert_refused(renew(gw, caller["key_id"]), status, outcome, reason)
    assert (expiry_on_disk(gw, keyed["key_id"]), expiry_on_disk(gw, caller["key_id"])) == before


def test_a_disabled_or_draining_account_refuses_renewal_and_extend(make_gateway, clean_stub: Stub) -> None:
    gw = make_gateway().start()
    keyed, caller = mint(gw, "d-k"), mint(gw, "d-c", driver="caller")
    set_state(gw, "disabled")
    assert_both_refused(gw, keyed, caller, 409, "rejected", "administrative-disabled")
    set_state(gw, "draining")
    assert_both_refused(gw, keyed, caller, 409, "rejected", "administrative-draining")
    set_state(gw, "enabled")
    status, _, extended = extend(gw, keyed["key_id"])
    assert status == 200 and extended["expires_at"] > keyed["expires_at"], extended
    status, _, renewed = renew(gw, caller["key_id"])
    assert (status, renewed["account_id"]) == (201, "legacy-anthropic"), renewed


def test_a_corrupt_policy_chain_holds_renewal_and_extend(make_gateway, clean_stub: Stub) -> None:
    gw = make_gateway().start()
    revision = gw.api("GET", "/control/v2/policy")[2]["revision"]
    status, _, body = gw.api(
        "PUT",
        "/control/v2/policy/level",
        {"name": "platform", "expected_revision": revision, "reason": "r", "document": {"max_fallback_hops": 1}},
    )
    assert status == 200, body
    keyed, caller = mint(gw, "d-k"), mint(gw, "d-c", driver="caller")
    chain = gw.state_dir / "policy.jsonl"
    chain.write_bytes(chain.read_bytes().replace(b'"max_fallback_hops":1', b'"max_fallback_hops":0'))
    assert_both_refused(gw, keyed, caller, 503, "held", "policy-unavailable")


def test_a_corrupt_admin_chain_holds_renewal_and_extend(make_gateway, clean_stub: Stub) -> None:
    gw = make_gateway().start()
    keyed, caller = mint(gw, "d-k"), mint(gw, "d-c", driver="caller")
    set_state(gw, "draining")
    set_state(gw, "enabled")
    chain = gw.state_dir / "account-admin.jsonl"
    chain.write_text("\n".join(chain.read_text().splitlines()[:-1]) + "\n")  # the re-enable rolled back
    assert_both_refused(gw, keyed, caller, 503, "held", "account-state-unavailable")


def test_an_exhausted_budget_holds_renewal_and_extend(make_gateway, clean_stub: Stub) -> None:
    gw = make_gateway().start()
    keyed, caller = mint(gw, "d-k"), mint(gw, "d-c", driver="caller")
    revision = gw.api("GET", "/control/v2/policy")[2]["revision"]
    status, _, body = gw.api(
        "PUT",
        "/control/v2/policy/level",
        {
            "name": "repo:acme/app",
            "expected_revision": revision,
            "reason": "r",
            "document": {"budgets": [{"window": "day", "usd": 0.00001}]},
        },
    )
    assert status == 200, body
    assert http("POST", gw.dataplane_url + "/v1/messages", BODY, {"x-api-key": caller["token"]})[0] == 200
    gw.wait_rows(1)
    assert_both_refused(gw, keyed, caller, 503, "held", "budget-exhausted")


def test_an_open_circuit_does_not_refuse_a_key_that_holds_its_slot(make_gateway, clean_stub: Stub) -> None:
    gw = make_gateway({"GATEWAY_CIRCUIT_COOLDOWN_SECONDS": "600"}).start()
    keyed, caller = mint(gw, "d-k"), mint(gw, "d-c", driver="caller")
    for _ in range(3):  # three consecutive provider-overloaded terminals open the circuit
        assert (
            http(
                "POST",
                gw.dataplane_url + "/v1/messages",
                BODY,
                {"x-api-key": caller["token"], "x-stub-step": '{"status": 529}'},
            )[0]
            == 529
        )
    gw.wait_rows(3)
    status, _, held = gw.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": "d-new",
            "repo_slug": "acme/app",
            "principal_kind": "worker",
            "principal_id": "w-1",
            "model": MODEL,
        },
    )
    assert (status, held["refusal_reason"], held["skipped"][0]["code"]) == (
        503,
        "no-eligible-account",
        "circuit-open",
    ), held
    status, _, renewed = renew(gw, caller["key_id"])
    assert (status, renewed["account_id"]) == (201, "legacy-anthropic"), renewed
    status, _, extended = extend(gw, keyed["key_id"])
    assert status == 200, extended
