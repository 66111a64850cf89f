"""Routing policy end to end (SPEC §10, §8): real daemons, real policy chain, real stub upstream.

Every extra account points at the session stub with its Anthropic key, so accounts differ only
by id — which is what the mint answers name.
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import Any

from tests.support.harness import Gateway, http

MODEL = "claude-sonnet-4-6"
PAY, OTHER = "acme/pay", "acme/other"


def accounts_toml(stub_url: str, *ids: str, binding: str = "anthropic", models: str = '"claude-*"') -> str:
    return "".join(
        f'''
[[account]]
id = "{account_id}"
provider_binding = "{binding}"
base_url = "{stub_url}"
auth_style = "x-api-key"
credential_env = "GATEWAY_{account_id.upper().replace("-", "_")}_KEY"
models = [{models}]
'''
        for account_id in ids
    )


def pool(
    make_gateway,
    tmp_path: Path,
    stub,
    *ids: str,
    extra: dict[str, str] | None = None,
    unconfigured: tuple[str, ...] = (),
) -> Gateway:
    path = tmp_path / "accounts.toml"
    path.write_text(accounts_toml(stub.url, *ids))
    env = {"GATEWAY_ACCOUNTS_FILE": str(path)}
    env.update({f"GATEWAY_{i.upper().replace('-', '_')}_KEY": stub.anthropic_key for i in ids if i not in unconfigured})
    env.update(extra or {})
    return make_gateway(env).start()


def put_level(
    gw: Gateway, name: str, document: dict[str, Any], expected: int, token: str | None = "admin"
) -> tuple[int, dict]:
    status, _, body = gw.api(
        "PUT",
        "/control/v2/policy/level",
        {"name": name, "expected_revision": expected, "document": document, "reason": "issue 7"},
        token=token,
    )
    return status, body


def mint(gw: Gateway, **fields: Any) -> tuple[int, dict]:
    body = {
        "dispatch_id": "d-1",
        "repo_slug": PAY,
        "principal_kind": "worker",
        "principal_id": "w-1",
        "model": MODEL,
        **fields,
    }
    body = {k: v for k, v in body.items() if v is not None}
    status, _, payload = gw.api("POST", "/control/v2/mint", body)
    return status, payload


def call(gw: Gateway, token: str, model: str = MODEL, step: str | None = None) -> int:
    headers = {"x-api-key": token}
    if step:
        headers["x-stub-step"] = step
    return http(
        "POST",
        gw.dataplane_url + "/v1/messages",
        {"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        headers,
    )[0]


def fail_and_release(gw: Gateway, minted: dict, status: int) -> None:
    assert call(gw, minted["token"], minted["effective_model"], f'{{"status": {status}}}') == status
    assert gw.revoke(minted["key_id"])


def retry(gw: Gateway, cited: dict, **fields: Any) -> tuple[int, dict]:
    return mint(gw, retry_of_mint_decision_id=cited["mint_decision_id"], **fields)


def lease_count(gw: Gateway) -> int:
    return sum(a["lease_count"] for a in gw.api("GET", "/control/v2/accounts")[2]["accounts"])


def test_a_team_policy_narrows_account_order_for_its_repos_only(make_gateway, tmp_path, clean_stub):
    gw = pool(make_gateway, tmp_path, clean_stub, "anthropic-b", "anthropic-c")
    status, written = put_level(
        gw, "team:payments", {"repos": [PAY], "account_order": ["anthropic-c", "anthropic-b"]}, 0
    )
    assert (status, written["revision"]) == (200, 1), written

    status, first = mint(gw)
    assert status == 201, first
    assert (first["account_id"], first["fallback_position"], first["policy_revision"]) == ("anthropic-c", 0, 1)
    status, other = mint(gw, repo_slug=OTHER)
    assert (status, other["account_id"]) == (201, "legacy-anthropic")

    # the narrowed list is the whole pool: one hop to anthropic-b, then nothing (never legacy-anthropic)
    fail_and_release(gw, first, 429)
    status, second = retry(gw, first)
    assert (status, second["account_id"], second["fallback_position"], second["hop"]) == (201, "anthropic-b", 1, 1)


def test_a_binding_policy_narrows_fallback_on_for_that_role_only(make_gateway, tmp_path, clean_stub):
    gw = pool(make_gateway, tmp_path, clean_stub, "anthropic-b")
    assert put_level(gw, f"binding:{PAY}#reviewer", {"fallback_on": ["rate-limited"]}, 0)[0] == 200

    status, reviewer = mint(gw, dispatch_id="d-rev", worker_role="reviewer")
    assert status == 201
    fail_and_release(gw, reviewer, 500)
    status, held = retry(gw, reviewer, dispatch_id="d-rev", worker_role="reviewer")
    assert (status, held["outcome"], held["refusal_reason"]) == (503, "held", "fallback-not-authorised")

    status, implementer = mint(gw, dispatch_id="d-impl", worker_role="implementer")
    fail_and_release(gw, implementer, 500)
    status, hop = retry(gw, implementer, dispatch_id="d-impl", worker_role="implementer")
    assert (status, hop["account_id"], hop["hop"]) == (201, "anthropic-b", 1)

    # the reviewer still hops on what its policy names
    status, again = mint(gw, dispatch_id="d-rev-2", worker_role="reviewer")
    fail_and_release(gw, again, 429)
    status, hop = retry(gw, again, dispatch_id="d-rev-2", worker_role="reviewer")
    assert (status, hop["account_id"]) == (201, "anthropic-b")

    # and a binding's hop budget is the policy's: zero refuses every hop for that role
    assert put_level(gw, f"binding:{PAY}#lead", {"max_fallback_hops": 0}, 1)[0] == 200
    status, lead = mint(gw, dispatch_id="d-lead", worker_role="lead")
    fail_and_release(gw, lead, 429)
    status, held = retry(gw, lead, dispatch_id="d-lead", worker_role="lead")
    assert (status, held["refusal_reason"]) == (503, "fallback-budget-exhausted")


def test_a_model_class_lets_a_fallback_cross_bindings(make_gateway, tmp_path, clean_stub):
    gw = make_gateway().start()
    classes = {"top": {"anthropic": MODEL, "zai-harness": "glm-4.6"}}
    assert put_level(gw, "platform", {"model_classes": classes}, 0)[0] == 200

    status, first = mint(gw, model=None, model_class="top")
    assert status == 201, first
    assert (first["account_id"], first["effective_model"]) == ("legacy-anthropic", MODEL)
    fail_and_release(gw, first, 529)
    status, second = retry(gw, first, model=None, model_class="top")
    assert status == 201, second
    assert (second["account_id"], second["effective_model"], second["fallback_position"], second["hop"]) == (
        "legacy-zai-harness",
        "glm-4.6",
        1,
        1,
    )
    assert call(gw, second["token"], "glm-4.6") == 200
    # a plain model mint for the same dispatch never crosses: its boundary is the model
    status, plain = mint(gw, dispatch_id="d-plain")
    fail_and_release(gw, plain, 529)
    status, refused = retry(gw, plain, dispatch_id="d-plain")
    assert (status, refused["refusal_reason"]) == (409, "fallback-pool-exhausted")


def test_a_hop_after_a_policy_change_starts_past_the_cited_account(make_gateway, tmp_path, clean_stub):
    gw = pool(make_gateway, tmp_path, clean_stub, "anthropic-b", "anthropic-c")
    status, first = mint(gw)
    assert (status, first["account_id"], first["policy_revision"]) == (201, "legacy-anthropic", 0)
    fail_and_release(gw, first, 429)
    # the cited account moves to position 1: the hop starts at 2 — past anthropic-c at 0, and
    # never back on the account that failed
    assert (
        put_level(gw, f"repo:{PAY}", {"account_order": ["anthropic-c", "legacy-anthropic", "anthropic-b"]}, 0)[0] == 200
    )
    status, second = retry(gw, first)
    assert status == 201, second
    assert (second["account_id"], second["fallback_position"], second["policy_revision"]) == ("anthropic-b", 2, 1)

    status, other = mint(gw, dispatch_id="d-2")
    assert (status, other["account_id"]) == (201, "anthropic-c")
    fail_and_release(gw, other, 429)
    assert put_level(gw, f"repo:{PAY}", {"account_order": ["legacy-anthropic", "anthropic-b"]}, 1)[0] == 200
    status, refused = retry(gw, other, dispatch_id="d-2")
    assert (status, refused["outcome"], refused["refusal_reason"]) == (409, "rejected", "fallback-lineage-mismatch")
    assert refused["policy_revision"] == 2


def test_explain_names_the_deciding_level_for_every_field(make_gateway, tmp_path, clean_stub):
    gw = pool(
        make_gateway,
        tmp_path,
        clean_stub,
        "anthropic-b",
        "anthropic-c",
        unconfigured=("anthropic-b",),
        extra={"GATEWAY_MAX_FALLBACK_HOPS": "3", "GATEWAY_FALLBACK_ON": "rate-limited,overloaded"},
    )
    writes = [
        ("platform", {"providers": ["anthropic", "zai-harness"], "locks": ["providers"]}),
        ("org:acme", {"teams": ["payments"], "max_fallback_hops": 2}),
        ("team:payments", {"repos": [PAY], "account_order": ["anthropic-b", "anthropic-c", "legacy-anthropic"]}),
        (f"repo:{PAY}", {"model_classes": {"top": {"anthropic": MODEL}}, "providers": ["openai"]}),
        (f"binding:{PAY}#reviewer", {"fallback_on": ["rate-limited", "upstream-unavailable"]}),
    ]
    for revision, (name, document) in enumerate(writes):
        status, body = put_level(gw, name, document, revision)
        assert status == 200, body
    status, _, explained = gw.api(
        "GET", f"/control/v2/policy/explain?repo_slug={PAY}&worker_role=reviewer&model={MODEL}"
    )
    assert status == 200, explained
    assert explained["provenance"] == {
        "account_order": "team:payments",
        "providers": "platform",
        "fallback_on": f"binding:{PAY}#reviewer",
        "max_fallback_hops": "org:acme",
        "model_classes": f"repo:{PAY}",
        "model_classes.top.anthropic": f"repo:{PAY}",
        "min_headroom_percent": "default",
    }
    assert explained["locked_by"] == {"providers": "platform"}
    assert explained["vetoed"] == {"providers": [f"repo:{PAY}"]}
    assert explained["ceilinged"] == ["fallback_on"]
    assert explained["resolved"]["fallback_on"] == ["rate-limited"]
    assert explained["resolved"]["max_fallback_hops"] == 2
    assert explained["resolved"]["min_headroom_percent"] == 0  # SPEC §22: off unless a level sets it
    assert explained["tenancy"]["team"] == "payments" and explained["tenancy"]["org"] == "acme"
    assert [(c["account_id"], c["position"], c["code"]) for c in explained["candidates"]] == [
        ("anthropic-b", 0, "not-configured"),
        ("anthropic-c", 1, None),
        ("legacy-anthropic", 2, None),
    ]
    would = explained["would_select"]
    assert (would["outcome"], would["account_id"], would["fallback_position"]) == ("selected", "anthropic-c", 1)
    assert would["skipped"] == [{"account_id": "anthropic-b", "position": 0, "code": "not-configured"}]
    assert lease_count(gw) == 0  # a dry run: no lease taken

    # the mint agrees with the dry run
    status, minted = mint(gw, worker_role="reviewer")
    assert (status, minted["account_id"], minted["policy_revision"]) == (201, "anthropic-c", 5)
    # another repo, no role, by class: nothing but the platform answers
    status, _, plain = gw.api("GET", f"/control/v2/policy/explain?repo_slug={OTHER}&model_class=top")
    assert plain["provenance"]["account_order"] == "default" and plain["provenance"]["fallback_on"] == "ceiling"
    assert plain["would_select"]["refusal_reason"] == "model-not-served"


def test_a_tampered_policy_chain_holds_mints_and_refuses_writes(make_gateway, tmp_path, clean_stub):
    gw = make_gateway().start()
    assert put_level(gw, "platform", {"max_fallback_hops": 1}, 0)[0] == 200
    assert mint(gw)[0] == 201
    chain = gw.state_dir / "policy.jsonl"
    chain.write_bytes(chain.read_bytes().replace(b'"max_fallback_hops":1', b'"max_fallback_hops":0'))

    status, held = mint(gw, dispatch_id="d-2")
    assert (status, held["outcome"], held["refusal_reason"]) == (503, "held", "policy-unavailable")
    status, refused = put_level(gw, "platform", {}, 1)
    assert (status, refused["error"]["code"]) == (503, "policy-unavailable")
    view = gw.api("GET", "/control/v2/policy")[2]
    assert (view["chain_verdict"], view["revision"], view["levels"]) == ("corrupt", None, None)
    explained = gw.api("GET", f"/control/v2/policy/explain?repo_slug={PAY}&model={MODEL}")[2]
    assert explained["would_select"]["refusal_reason"] == "policy-unavailable"


def test_two_writers_with_one_expected_revision_get_exactly_one_409(make_gateway, clean_stub):
    gw = make_gateway().start()
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool_:
        results = list(pool_.map(lambda n: put_level(gw, f"repo:acme/r{n}", {"max_fallback_hops": 0}, 0), range(4)))
    statuses = sorted(status for status, _ in results)
    assert statuses == [200, 409, 409, 409]
    conflicts = [body for status, body in results if status == 409]
    assert all(b["error"]["code"] == "revision-conflict" and b["error"]["current_revision"] == 1 for b in conflicts)
    audit = gw.api("GET", "/control/v2/policy/audit")[2]
    assert audit["revision"] == 1 and len(audit["records"]) == 1
