"""A revoke never overtakes its key's rows (SPEC §3): when a revoke returns, control holds every
row of every attempt the data plane finished on that key — so a half-open circuit's probe that
succeeded and is revoked at once closes the circuit, instead of being dropped as "ended without
a terminal" (which left the circuit half-open and made the next mint a second probe).

The worker's revoke (HTTP to control) races the probe's 2xx row (sent lazily over the RPC), so
the scenario is run in a loop; `tests/integration/test_revoke_ordering.py` holds the same
ordering deterministically over the real socket.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.attempts import A_BODY, A_HEADERS, step
from tests.support.harness import Gateway, http
from tests.support.waits import wait_until

LOOPS = 6  # before the fix, 17 of 20 loops lost the probe (json and stream alike)
ACCOUNT = "legacy-anthropic"


def mint(gw: Gateway, dispatch_id: str) -> dict[str, Any]:
    status, _, body = gw.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": dispatch_id,
            "repo_slug": "acme/app",
            "principal_kind": "worker",
            "principal_id": "w-1",
            "model": A_BODY["model"],
        },
    )
    assert status == 201, body
    return body


def circuit(gw: Gateway) -> dict[str, Any]:
    accounts = gw.api("GET", "/control/v2/accounts")[2]["accounts"]
    return next(a for a in accounts if a["id"] == ACCOUNT)["circuit"]


def call(gw: Gateway, token: str, **answer: Any) -> int:
    headers = {**A_HEADERS, "x-api-key": token, **(step(**answer) if answer else {})}
    return http("POST", gw.dataplane_url + "/v1/messages", A_BODY, headers)[0]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_succeeded_probe_revoked_at_once_closes_the_circuit(make_gateway, clean_stub, stream: bool) -> None:
    gw = make_gateway({"GATEWAY_CIRCUIT_COOLDOWN_SECONDS": "1"}).start()
    body = {**A_BODY, "stream": stream}
    for loop in range(LOOPS):
        opener = mint(gw, f"d-open-{loop}")
        for _ in range(3):  # three qualifying failures open the circuit
            assert call(gw, opener["token"], status=529) == 529
        assert gw.revoke(opener["key_id"])
        assert circuit(gw)["state"] in ("open", "half-open"), loop  # half-open: a slow machine
        wait_until(lambda: circuit(gw)["state"] == "half-open", 10, "the circuit to half-open")

        probe = mint(gw, f"d-probe-{loop}")
        headers = {**A_HEADERS, "x-api-key": probe["token"]}
        status, _, answer = http("POST", gw.dataplane_url + "/v1/messages", body, headers)
        assert status == 200, answer
        assert gw.revoke(probe["key_id"])  # at once: no wait for the row
        assert circuit(gw)["state"] == "closed", f"loop {loop}: the probe's success was lost to its revoke"
