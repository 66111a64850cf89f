"""Per-account request capacity (issue 3 item 7, SPEC §6) through both daemons: a full account
answers 429 `request-capacity-exhausted` with Retry-After at once, and the aborted stream's slot
comes back.

The v1 mint only leases the legacy accounts, which have no ceiling; an account with a
`request_capacity` comes from `GATEWAY_ACCOUNTS_FILE` and is reached through the v2 mint. Every
ending returning its slot, row by row, is `tests/integration/test_dataplane_capacity.py`.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.attempts import A_BODY, A_HEADERS, read_until, rows_for, send_raw, settled, step
from tests.support.harness import Stub
from tests.support.harness import http as call
from tests.support.waits import wait_until

ACCOUNT = "capped-anthropic"


def test_request_capacity_end_to_end_through_the_v2_mint(make_gateway, clean_stub: Stub, tmp_path: Path) -> None:
    accounts = tmp_path / "accounts.toml"
    accounts.write_text(
        f'[[account]]\nid = "{ACCOUNT}"\nprovider_binding = "anthropic"\nbase_url = "{clean_stub.url}"\n'
        'auth_style = "x-api-key"\ncredential_env = "GATEWAY_CAPPED_KEY"\nmodels = ["capped-*"]\n'
        "request_capacity = 1\n"
    )
    gw = make_gateway({"GATEWAY_ACCOUNTS_FILE": str(accounts), "GATEWAY_CAPPED_KEY": clean_stub.anthropic_key}).start()
    status, _, minted = gw.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": "d-1",
            "repo_slug": "acme/app",
            "principal_kind": "worker",
            "principal_id": "w-1",
            "model": "capped-model-1",
        },
    )
    assert status == 201 and minted["account_id"] == ACCOUNT, minted
    body = {**A_BODY, "model": "capped-model-1"}
    sock = send_raw(
        gw, {**body, "stream": True}, {"x-api-key": minted["token"], **step(stall_after_events=3, stall_s=30)}
    )
    read_until(sock, b"event: ping")
    status, headers, answer = call(
        "POST", gw.dataplane_url + "/v1/messages", body, {**A_HEADERS, "x-api-key": minted["token"]}
    )
    assert status == 429 and headers["retry-after"] == "1"
    assert answer["error"]["code"] == "request-capacity-exhausted"
    refused = wait_until(lambda: rows_for(gw, minted["key_id"]), 10, "the refusal's row")
    assert [(r["status"], r["refusal_reason"], r["condition"]) for r in refused] == [
        ("refused", "request-capacity-exhausted", None)
    ]
    sock.close()
    wait_until(lambda: gw.active()["count"] == 0, 10, "the aborted stream ended")
    status, _, _ = call("POST", gw.dataplane_url + "/v1/messages", body, {**A_HEADERS, "x-api-key": minted["token"]})
    assert status == 200  # the aborted stream returned its slot
    rows = settled(gw, minted["key_id"], 3)
    assert [r["status"] for r in rows] == ["refused", "client-aborted", "completed"]
