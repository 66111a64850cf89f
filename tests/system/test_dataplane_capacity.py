"""Per-account request capacity (issue 3 item 7, SPEC §6): a full account answers 429
`request-capacity-exhausted` with Retry-After at once, and every ending returns the slot.

The v1 mint only leases the legacy accounts, which have no ceiling; an account with a
`request_capacity` comes from `GATEWAY_ACCOUNTS_FILE` and is reached through the v2 mint. The
first test runs the real data plane in this process (`tests/support/inprocess.py`), where each
terminal row waits in the link's outbox for the test to read. The second drives both daemons end
to end.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp

from tests.support.attempts import A_BODY, A_HEADERS, read_until, rows_for, send_raw, settled, step
from tests.support.harness import Stub
from tests.support.harness import http as call
from tests.support.inprocess import anthropic_plane
from tests.support.waits import until, wait_until

ACCOUNT = "capped-anthropic"


async def test_request_capacity_429_and_every_ending_returns_the_slot(stub: Stub, tmp_path: Path) -> None:
    async with anthropic_plane(stub, tmp_path, ACCOUNT, request_capacity=1) as plane:
        url, proxy = plane.url, plane.proxy
        headers = {**A_HEADERS, "x-api-key": plane.token}
        async with aiohttp.ClientSession() as session:
            holder = await session.post(url, json={**A_BODY, "stream": True},
                                        headers={**headers, **step(stall_after_events=3, stall_s=30)})
            assert holder.status == 200
            await holder.content.readuntil(b"event: ping")
            assert proxy.capacity.count(ACCOUNT) == 1

            async with session.post(url, json=A_BODY, headers=headers) as refused:
                body = await refused.json()
                assert refused.status == 429 and refused.headers["retry-after"] == "1"
                assert body["error"]["type"] == "rate_limit_error"
                assert body["error"]["code"] == "request-capacity-exhausted"
                assert refused.headers["request-id"] == body["request_id"]

            holder.close()  # the worker goes away: the slot comes back with the aborted attempt
            await until(lambda: proxy.capacity.count(ACCOUNT) == 0 and not proxy.in_flight, 10,
                        "the aborted stream's slot returned")
            async with session.post(url, json=A_BODY, headers=headers) as served:
                assert served.status == 200
            async with session.post(url, json=A_BODY, headers={**headers, **step(status=529)}) as failed:
                assert failed.status == 529
            async with session.post(url, json=A_BODY, headers=headers) as again:
                assert again.status == 200  # an upstream error returned its slot too
        await until(lambda: not proxy.in_flight, 10, "no attempt in flight")
    link = plane.link

    rows = list(link.outbox.values())
    assert [(r.status, r.refusal_reason, r.condition) for r in rows] == [
        ("refused", "request-capacity-exhausted", None),
        ("client-aborted", None, None),
        ("completed", None, None),
        ("upstream-error", None, "overloaded"),
        ("completed", None, None),
    ]
    assert rows[0].http_status == 429 and rows[0].retry_after_s == 1
    assert link.in_flight == {} and proxy.capacity.count(ACCOUNT) == 0
    assert len({r.attempt_id for r in rows}) == 5


def test_request_capacity_end_to_end_through_the_v2_mint(make_gateway, clean_stub: Stub, tmp_path: Path) -> None:
    accounts = tmp_path / "accounts.toml"
    accounts.write_text(
        f'[[account]]\nid = "{ACCOUNT}"\nprovider_binding = "anthropic"\nbase_url = "{clean_stub.url}"\n'
        'auth_style = "x-api-key"\ncredential_env = "GATEWAY_CAPPED_KEY"\nmodels = ["capped-*"]\n'
        'request_capacity = 1\n')
    gw = make_gateway({"GATEWAY_ACCOUNTS_FILE": str(accounts),
                       "GATEWAY_CAPPED_KEY": clean_stub.anthropic_key}).start()
    status, _, minted = gw.api("POST", "/control/v2/mint", {
        "dispatch_id": "d-1", "repo_slug": "acme/app", "principal_kind": "worker", "principal_id": "w-1",
        "model": "capped-model-1"})
    assert status == 201 and minted["account_id"] == ACCOUNT, minted
    body = {**A_BODY, "model": "capped-model-1"}
    sock = send_raw(gw, {**body, "stream": True},
                    {"x-api-key": minted["token"], **step(stall_after_events=3, stall_s=30)})
    read_until(sock, b"event: ping")
    status, headers, answer = call("POST", gw.dataplane_url + "/v1/messages", body,
                                   {**A_HEADERS, "x-api-key": minted["token"]})
    assert status == 429 and headers["retry-after"] == "1"
    assert answer["error"]["code"] == "request-capacity-exhausted"
    refused = wait_until(lambda: rows_for(gw, minted["key_id"]), 10, "the refusal's row")
    assert [(r["status"], r["refusal_reason"], r["condition"]) for r in refused] == [
        ("refused", "request-capacity-exhausted", None)]
    sock.close()
    wait_until(lambda: gw.active()["count"] == 0, 10, "the aborted stream ended")
    status, _, _ = call("POST", gw.dataplane_url + "/v1/messages", body,
                        {**A_HEADERS, "x-api-key": minted["token"]})
    assert status == 200  # the aborted stream returned its slot
    rows = settled(gw, minted["key_id"], 3)
    assert [r["status"] for r in rows] == ["refused", "client-aborted", "completed"]
