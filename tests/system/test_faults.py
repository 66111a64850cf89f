"""The fault campaign (issue 9 item 4): each fault, the client's answer, nothing lost or
duplicated in the ledger, and recovery without an operator."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from tests.support.harness import Gateway, Stub, http
from tests.support.waits import wait_until

MODEL = "claude-sonnet-4-6"
BODY = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}


def call(gw: Gateway, token: str, step: str | None = None, stream: bool = False, timeout_s: float = 30):
    headers = {"x-api-key": token, **({"x-stub-step": step} if step else {})}
    return http("POST", gw.dataplane_url + "/v1/messages", {**BODY, "stream": stream}, headers, timeout_s=timeout_s)


def in_background(fn) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = fn()
        except Exception as exc:  # recorded for the assertion, not swallowed
            result["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_control_killed_mid_stream_loses_and_duplicates_nothing(make_gateway, clean_stub: Stub):
    gw = make_gateway().start()
    minted = gw.mint()
    thread, result = in_background(
        lambda: call(gw, minted["token"], '{"stall_after_events": 3, "stall_s": 2}', stream=True)
    )
    wait_until(lambda: gw.active()["count"] == 1, 10, "stream in flight")
    gw.control.kill()
    gw.start_control()
    gw.wait_synchronised()
    # the data plane re-announced the stream it still carries
    wait_until(lambda: gw.active()["count"] == 1 or gw.ledger(), 10, "stream re-announced")
    thread.join(20)
    status, _, text = result["value"]
    assert status == 200 and "message_stop" in text  # the worker's stream was never touched
    rows = wait_until(lambda: gw.ledger(), 10, "the stream's row")
    assert len(rows) == 1 and rows[0]["status"] == "completed"
    assert gw.active()["count"] == 0


def test_data_plane_killed_mid_stream_and_restarted(make_gateway, clean_stub: Stub):
    gw = make_gateway().start()
    minted = gw.mint()
    thread, result = in_background(
        lambda: call(gw, minted["token"], '{"stall_after_events": 2, "stall_s": 30}', stream=True)
    )
    wait_until(lambda: gw.active()["count"] == 1, 10, "stream in flight")
    gw.dataplane.kill()
    thread.join(10)
    assert "error" in result or result["value"][0] == 200  # the worker sees a broken stream
    rows = wait_until(lambda: gw.ledger(), 15, "the lost route's row")
    assert [r["refusal_reason"] for r in rows] == ["dataplane-lost"]
    gw.start_dataplane()
    gw.wait_synchronised()
    assert call(gw, minted["token"])[0] == 200  # the lease survived: control replayed it
    assert len(gw.wait_rows(2)) == 2


def test_rpc_socket_removed_is_rebound(make_gateway, clean_stub: Stub):
    gw = make_gateway().start()
    minted = gw.mint()
    socket_path = gw.runtime_dir / "control.sock"
    os.unlink(socket_path)
    assert call(gw, minted["token"])[0] == 200  # the live link does not need the file
    wait_until(socket_path.exists, 10, "control to rebind its socket")
    gw.dataplane.stop()
    gw.start_dataplane()
    gw.wait_synchronised()
    assert call(gw, minted["token"])[0] == 200


def test_ledger_storage_failure_refuses_rather_than_serves_unrecorded(make_gateway, clean_stub: Stub, tmp_path: Path):
    gw = make_gateway()
    gw.state_dir.mkdir(parents=True)
    ledger = gw.state_dir / "ledger.jsonl"
    os.symlink("/dev/full", ledger)  # every append fails with ENOSPC: a full disk
    gw.start()
    minted = gw.mint()
    assert call(gw, minted["token"])[0] == 200  # served before the failure was known; its row waits

    def refused() -> bool:
        status, _, body = call(gw, minted["token"])
        return status == 503 and body["error"]["code"] == "observation-storage-unavailable"

    wait_until(refused, 10, "503 observation-storage-unavailable")
    assert (gw.healthz() or {}).get("ledger_ok") is False

    ledger.unlink()
    ledger.touch()  # space is back
    wait_until(lambda: call(gw, minted["token"])[0] == 200, 15, "service restored without an operator")
    rows = gw.wait_rows(3)
    ids = [r["attempt_id"] for r in rows]
    assert len(ids) == len(set(ids))
    assert rows[0]["status"] == "completed"  # the first, served row was not lost
    assert any(r["refusal_reason"] == "observation-storage-unavailable" for r in rows)


def test_upstream_that_accepts_but_never_answers(make_gateway, tmp_path: Path):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    port = silent.getsockname()[1]
    try:
        gw = make_gateway(
            {
                "GATEWAY_ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}",
                "GATEWAY_ANTHROPIC_API_KEY": "sk-ant-api03-silentsilentsilent",
                "GATEWAY_UPSTREAM_HEADERS_TIMEOUT": "1",
            },
            upstream=None,
        ).start()
        minted = gw.mint()
        status, headers, body = call(gw, minted["token"])
        assert status == 504 and body["type"] == "error" and body["error"]["code"] == "upstream-timeout"
        rows = gw.wait_rows(1)
        assert rows[0]["status"] == "transport-error" and rows[0]["condition"] == "transport-error"
        assert gw.active()["count"] == 0
    finally:
        silent.close()


@pytest.mark.parametrize("future_s", [7200])
def test_clock_jump_expires_leases_through_the_seam(future_s: int, tmp_path: Path):
    """In-process: the reaper, given a clock two hours ahead, ends every lease once."""
    import asyncio

    from controlplane.core.pricing import PriceTable
    from controlplane.stores.keys import KeyTable
    from shared.clock import now_ms
    from shared.codes import Binding
    from tests.support.control import make_control

    async def scenario() -> None:
        service = make_control(tmp_path, env={"GATEWAY_ANTHROPIC_API_KEY": "k"}, prices=PriceTable(price=())).service
        minted = [await service.mint_v1(Binding.ANTHROPIC, "worker", "w", "r", 60) for _ in range(3)]
        assert await service.reap_expired() == 0
        assert await service.lease_capacity.count("legacy-anthropic") == 3
        assert await service.reap_expired(now=now_ms() + future_s * 1000) == 3
        assert await service.reap_expired(now=now_ms() + future_s * 1000) == 0  # once
        assert await service.lease_capacity.count("legacy-anthropic") == 0 and service.keys.all() == []
        reloaded = KeyTable(str(tmp_path / "keys.jsonl"))
        reloaded.load(now_ms())
        assert reloaded.all() == [] and len(minted) == 3

    asyncio.run(scenario())
