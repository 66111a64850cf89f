"""The data plane's `GET /healthz` (SPEC §12): no key, never proxied; 200 `{status, control,
leases}` while synchronised with control, 503 with `retry-after` while not — the same fact its
traffic depends on (a data plane without control answers every request 503). And the probe the
systemd unit runs on it (`python -m dataplane.probe`)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.harness import Gateway, Stub, http
from tests.support.waits import wait_until


def healthz(gw: Gateway, method: str = "GET", headers: dict[str, str] | None = None):
    return http(method, gw.dataplane_url + "/healthz", None, headers)


def probe(gw: Gateway, *argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in gw.env.items() if not k.startswith("GATEWAY_")}
    env["GATEWAY_DATAPLANE_LISTEN"] = gw.env["GATEWAY_DATAPLANE_LISTEN"]
    return subprocess.run(
        [sys.executable, "-m", "dataplane.probe", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_healthz_needs_no_key_is_never_proxied_and_counts_leases(make_gateway, clean_stub: Stub) -> None:
    gw = make_gateway().start()
    status, headers, body = healthz(gw)
    assert (status, body) == (200, {"status": "ok", "control": "synchronised", "leases": 0})
    assert headers["content-type"].startswith("application/json") and "retry-after" not in headers
    minted = gw.mint()
    assert healthz(gw)[2]["leases"] == 1
    # a key, a body or another wire's headers change nothing: it is never a proxied request
    for extra in (
        {"x-api-key": minted["token"]},
        {"authorization": f"Bearer {minted['token']}"},
        {"anthropic-version": "2023-06-01"},
    ):
        assert healthz(gw, headers=extra)[:3:2] == (200, {"status": "ok", "control": "synchronised", "leases": 1})
    assert healthz(gw, "HEAD")[0] == 200
    status, headers, _ = http(
        "POST", gw.dataplane_url + "/healthz", {"model": "claude-sonnet-4-6"}, {"x-api-key": minted["token"]}
    )
    assert status == 405 and headers["allow"] == "GET, HEAD"
    assert clean_stub.requests() == []
    assert gw.ledger() == [] and gw.active()["count"] == 0  # no attempt, no row
    assert gw.revoke(minted["key_id"])
    assert healthz(gw)[2]["leases"] == 0


def test_healthz_is_503_while_control_is_away_and_200_once_resynchronised(make_gateway) -> None:
    gw = make_gateway().start()
    assert probe(gw, "--timeout", "10").returncode == 0
    gw.mint()
    gw.control.kill()

    def unavailable():
        status, headers, body = healthz(gw)
        return status == 503 and (headers, body)

    headers, body = wait_until(unavailable, 10, "data plane healthz 503")
    assert headers["retry-after"] == "1"
    assert body == {"status": "unavailable", "control": "disconnected", "leases": 0}  # fails closed
    refused = probe(gw, "--timeout", "0.5")
    assert refused.returncode == 1 and "503" in refused.stderr, refused.stderr

    gw.start_control()
    gw.wait_synchronised()
    status, _, body = healthz(gw)
    assert (status, body["status"], body["control"]) == (200, "ok", "synchronised")
    assert probe(gw, "--timeout", "10").returncode == 0


def test_the_probe_waits_for_a_data_plane_that_is_still_starting(make_gateway) -> None:
    """What the unit's ExecStartPost= relies on: started right after the daemon, the probe
    returns 0 only once the data plane is synchronised."""
    gw = make_gateway()
    gw.start_control()
    gw.start_dataplane()
    done = probe(gw, "--timeout", "30")
    assert done.returncode == 0, done.stderr
    assert healthz(gw)[0] == 200
