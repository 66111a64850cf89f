"""Embedded mode: the decisions of live leases outlive a control restart (SPEC §5), with the real
daemons, two stub upstreams (`legacy-anthropic`, then `anthropic-team-b`) and the journal fleet
mode keeps (`lease-decisions.jsonl`). After control restarts, a caller-driven lease renews on its
account and position, a dispatch key extends, and a 429 on the dispatch key still hops it to the
sibling: the worker's own retry is served there. Before, each answered 404 `decision-unknown`
(or never hopped). And a retry or a supersede citing a lease released before the restart (its
decision and evidence kept an hour after its key ended) is answered exactly as its twin was
before the restart, also when junk was appended to the journal meanwhile; before, each was
`fallback-lineage-unknown`."""

from __future__ import annotations

import json

from tests.support.harness import Gateway, http
from tests.support.waits import wait_until
from tests.system.test_mint_v2_scenario import pool_gateway, second_stub  # noqa: F401 (fixture)

MODEL = "claude-sonnet-4-6"
A, B = "legacy-anthropic", "anthropic-team-b"
BODY = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
RATE_LIMITED = json.dumps({"status": 429, "headers": {"retry-after": "1"}})


def mint(gw: Gateway, dispatch: str, driver: str) -> dict:
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


def call(gw: Gateway, token: str, step: str | None = None) -> int:
    headers = {"x-api-key": token, **({"x-stub-step": step} if step else {})}
    return http("POST", gw.dataplane_url + "/v1/messages", BODY, headers)[0]


def restart_control(gw: Gateway) -> None:
    assert gw.control is not None
    gw.control.stop()
    gw.start_control()
    gw.wait_synchronised()


def test_renew_extend_and_a_hop_after_a_control_restart(make_gateway, tmp_path, clean_stub, second_stub) -> None:
    gw = pool_gateway(make_gateway, tmp_path, second_stub)
    keyed, caller = mint(gw, "d-keyed", "gateway"), mint(gw, "d-caller", "caller")
    assert keyed["account_id"] == caller["account_id"] == A
    restart_control(gw)

    status, _, renewed = gw.api("POST", f"/control/v2/keys/{caller['key_id']}/renew", {})
    assert status == 201, renewed
    assert (renewed["account_id"], renewed["fallback_position"], renewed["hop"]) == (A, 0, 0)
    assert gw.revoke(caller["key_id"])
    assert (gw.state_dir / "lease-decisions.jsonl").exists()
    status, _, extended = gw.api("POST", f"/control/v2/keys/{keyed['key_id']}/extend", {"ttl_seconds": 7200})
    assert status == 200, extended
    assert extended["mint_decision_id"] == keyed["mint_decision_id"]

    assert call(gw, keyed["token"], RATE_LIMITED) == 429  # a qualifying terminal: the key hops
    wait_until(lambda: call(gw, keyed["token"]) == 200, 15, "the worker's retry served")
    served = [r for r in gw.wait_rows(2) if r["key_id"] == keyed["key_id"] and r["status"] == "completed"]
    assert served and served[-1]["account_id"] == B, served
    assert len(second_stub.requests()) >= 1

    restart_control(gw)  # the hop's decision is the one kept
    status, _, again = gw.api("POST", f"/control/v2/keys/{keyed['key_id']}/extend", {"ttl_seconds": 7200})
    assert (status, again.get("account_id")) == (200, B), again


# ---- a retry citing a lease released before the restart (SPEC §5: "within that hour") --------


def cite(gw: Gateway, dispatch: str, **citation: str) -> tuple:
    """A citation's answer, as a worker sees it: status, outcome, refusal, account, position, hop."""
    body = {"dispatch_id": dispatch, "repo_slug": "acme/app", "principal_kind": "worker", "principal_id": "w-1"}
    status, _, answer = gw.api("POST", "/control/v2/mint", {**body, "model": MODEL, **citation})
    fields = ("outcome", "refusal_reason", "account_id", "fallback_position", "hop")
    return (status, *(answer.get(name) for name in fields))


def released(gw: Gateway, dispatch: str, step: str | None) -> str:
    """A caller-driven lease served once (429 with `step`, else 200), then revoked: its decision."""
    minted = mint(gw, dispatch, "caller")
    assert call(gw, minted["token"], step) == (429 if step else 200)
    assert gw.revoke(minted["key_id"])  # the release seam settles the row first: evidence is in
    return minted["mint_decision_id"]


def restart_control_on_a_hostile_journal(gw: Gateway) -> None:
    """Control restarts; meanwhile a torn line and junk were appended to the journal."""
    assert gw.control is not None
    gw.control.stop()
    with open(gw.state_dir / "lease-decisions.jsonl", "ab") as journal:
        journal.write(b'{"mark": "ended", "key_id": "K"}\n\xff\xfe junk\n{"mint_decision_id": "md_torn", "outc')
    gw.start_control()
    gw.wait_synchronised()


def test_a_retry_citing_a_lease_released_before_a_restart_is_answered_as_before(
    make_gateway, tmp_path, clean_stub, second_stub
) -> None:
    """Two twin dispatches each: one cited before the restart, its twin after. A 429 then a
    revoke authorises a retry one position down (to B, hop 1); a 200 then a revoke does not
    (`fallback-not-authorised`), and a supersede of it is refused (its response was not lost).
    Before the journal kept ended leases, every answer after the restart was
    `fallback-lineage-unknown`."""
    gw = pool_gateway(make_gateway, tmp_path, second_stub)
    limited = {when: released(gw, f"d-429-{when}", RATE_LIMITED) for when in ("before", "after")}
    served = {when: released(gw, f"d-200-{when}", None) for when in ("before", "after")}

    def answers(when: str) -> list[tuple]:
        return [
            cite(gw, f"d-200-{when}", retry_of_mint_decision_id=served[when]),
            cite(gw, f"d-200-{when}", supersedes_mint_decision_id=served[when]),
            cite(gw, f"d-429-{when}", retry_of_mint_decision_id=limited[when]),
        ]

    before = answers("before")
    assert before == [
        (503, "held", "fallback-not-authorised", None, None, None),
        (409, "rejected", "fallback-response-was-not-lost", None, None, None),
        (201, "selected", None, B, 1, 1),
    ], before
    restart_control_on_a_hostile_journal(gw)
    assert answers("after") == before
    assert cite(gw, "d-x", retry_of_mint_decision_id="md_torn")[2] == "fallback-lineage-unknown"
    assert (gw.state_dir / "lease-decisions.jsonl").stat().st_mode & 0o777 == 0o600
