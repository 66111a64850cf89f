"""Dispatch keys end to end (SPEC §17): the gateway hops a worker's one key, with the real daemons,
two stub upstreams and the official anthropic SDK, whose own retry reaches the sibling."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import anthropic
import pytest

from tests.support.harness import Gateway, Stub, base_env, http
from tests.support.waits import wait_until
from tests.system.test_mint_v2_scenario import pool_gateway, second_stub  # noqa: F401 (fixture)

MODEL = "claude-sonnet-4-6"
A, B = "legacy-anthropic", "anthropic-team-b"


def pool(make_gateway, tmp_path: Path, second: Stub, extra: dict | None = None) -> Gateway:
    return pool_gateway(make_gateway, tmp_path, second, extra)  # legacy-anthropic, then B on its own stub


def mint(gw: Gateway, driver: str | None = "gateway", dispatch: str = "d-1") -> dict:
    body = {
        "dispatch_id": dispatch,
        "repo_slug": "acme/app",
        "principal_kind": "worker",
        "principal_id": "w-1",
        "model": MODEL,
    }
    if driver is not None:
        body["fallback_driver"] = driver
    status, _, payload = gw.api("POST", "/control/v2/mint", body)
    assert status == 201, payload
    return payload


def client(gw: Gateway, token: str, retries: int = 2) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.dataplane_url, api_key=token, max_retries=retries, timeout=30)


def ask(sdk: anthropic.Anthropic) -> str:
    message = sdk.messages.create(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    return message.content[0].text


def rows_of(gw: Gateway, key_id: str, count: int) -> list[dict]:
    return wait_until(
        lambda: (rows := [r for r in gw.ledger() if r["key_id"] == key_id]) and len(rows) >= count and rows,
        15,
        f"{count} rows of the key",
    )


def account_of(gw: Gateway, key_id: str) -> str:
    status, _, body = gw.api("GET", "/control/v2/routes/recent?limit=200")
    return next(r["account_id"] for r in body["routes"] if r["key_id"] == key_id)


def test_a_429_hops_and_the_workers_own_retry_is_served_by_the_sibling(
    make_gateway, tmp_path, clean_stub, second_stub
) -> None:
    gw = pool(make_gateway, tmp_path, second_stub)
    minted = mint(gw)
    assert (minted["account_id"], minted["fallback_driver"]) == (A, "gateway")
    clean_stub.script({"status": 429, "headers": {"retry-after": "1"}})
    assert ask(client(gw, minted["token"]))  # the SDK retried once, on the same key
    first, second = rows_of(gw, minted["key_id"], 2)
    assert (first["account_id"], first["http_status"], first["condition"]) == (A, 429, "rate-limited")
    assert (second["account_id"], second["status"]) == (B, "completed")
    assert first["mint_decision_id"] == minted["mint_decision_id"] != second["mint_decision_id"]
    assert (first["hop"], second["hop"]) == (0, 1)  # SPEC §8, §14: the hop's lease carries its position
    assert len(clean_stub.requests()) == 1 and len(second_stub.requests()) == 1  # never re-sent
    accounts = {a["id"]: a for a in gw.api("GET", "/control/v2/accounts")[2]["accounts"]}
    assert (accounts[A]["lease_count"], accounts[B]["lease_count"]) == (0, 1)  # one live lease
    status, _, metrics = http(
        "GET", gw.control_url + "/metrics", headers={"Authorization": f"Bearer {gw.control_token}"}
    )
    assert 'leasehold_dispatch_hops_total{condition="rate-limited"} 1.0' in metrics


def test_the_budget_spent_leaves_the_key_where_it_is(make_gateway, tmp_path, clean_stub, second_stub) -> None:
    gw = pool(make_gateway, tmp_path, second_stub)  # GATEWAY_MAX_FALLBACK_HOPS=1
    minted = mint(gw)
    clean_stub.script({"status": 429, "headers": {"retry-after": "1"}})
    second_stub.script({"status": 429, "headers": {"retry-after": "1"}})
    assert ask(client(gw, minted["token"]))  # A 429 → hop → B 429 → no hop left → B 200
    rows = rows_of(gw, minted["key_id"], 3)
    assert [r["account_id"] for r in rows] == [A, B, B]
    assert [r["hop"] for r in rows] == [0, 1, 1]
    assert len(second_stub.requests()) == 2


@pytest.mark.parametrize(
    "step",
    [{"status": 400}, {"status": 200, "delay_s": 3}],
    ids=["a 400 is the request's fault", "a client abort is the worker's"],
)
def test_a_400_and_a_client_abort_never_hop(make_gateway, tmp_path, clean_stub, second_stub, step) -> None:
    gw = pool(make_gateway, tmp_path, second_stub)
    minted = mint(gw)
    clean_stub.script(step)
    sdk = client(gw, minted["token"], retries=0)
    if step["status"] == 400:
        with pytest.raises(anthropic.BadRequestError):
            ask(sdk)
    else:
        with pytest.raises(anthropic.APITimeoutError):
            ask(sdk.with_options(timeout=0.5))
    rows_of(gw, minted["key_id"], 1)
    assert ask(sdk)  # the next attempt is still on A
    assert [r["account_id"] for r in rows_of(gw, minted["key_id"], 2)] == [A, A]
    assert second_stub.requests() == []


def test_a_hop_waits_for_a_stream_in_flight_answering_fallback_pending(
    make_gateway, tmp_path, clean_stub, second_stub
) -> None:
    gw = pool(make_gateway, tmp_path, second_stub)
    minted = mint(gw)
    token = minted["token"]
    streamed: list[str] = []

    def slow_stream() -> None:
        with client(gw, token, retries=0).messages.stream(
            model=MODEL,
            max_tokens=16,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-stub-step": '{"deltas": 4, "stall_between_events_s": 0.5}'},
        ) as stream:
            streamed.append(stream.get_final_text())

    runner = threading.Thread(target=slow_stream)
    runner.start()
    try:
        wait_until(lambda: gw.active()["count"] == 1, 10, "the stream in flight")
        failed = http(
            "POST",
            gw.dataplane_url + "/v1/messages",
            {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
            {"x-api-key": token, "x-stub-step": '{"status": 529}'},
        )
        assert failed[0] == 529
        status, headers, body = http(
            "POST",
            gw.dataplane_url + "/v1/messages",
            {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
            {"x-api-key": token},
        )
        assert (status, headers.get("retry-after")) == (503, "1")
        assert body["type"] == "error" and gw.active()["count"] == 1  # gateway-authored, wire-shaped
    finally:
        runner.join(30)
    assert streamed and streamed[0]  # the stream in flight was never cut
    assert ask(client(gw, token, retries=0))
    rows = rows_of(gw, minted["key_id"], 4)
    by_status = sorted((r["account_id"], r["http_status"], r["refusal_reason"]) for r in rows)
    assert by_status == sorted([(A, 200, None), (A, 529, None), (A, 503, "fallback-pending"), (B, 200, None)])


def test_a_caller_driven_lease_is_never_moved(make_gateway, tmp_path, clean_stub, second_stub) -> None:
    gw = pool(make_gateway, tmp_path, second_stub)
    minted = mint(gw, driver=None)
    assert minted["fallback_driver"] == "caller"
    clean_stub.script({"status": 429, "headers": {"retry-after": "1"}})
    assert ask(client(gw, minted["token"]))
    assert [r["account_id"] for r in rows_of(gw, minted["key_id"], 2)] == [A, A]
    assert second_stub.requests() == []


def test_extend_moves_a_dispatch_keys_expiry_within_its_bounds(make_gateway, tmp_path, clean_stub, second_stub) -> None:
    gw = pool(make_gateway, tmp_path, second_stub)
    minted = mint(gw)
    key = minted["key_id"]
    status, _, extended = gw.api("POST", f"/control/v2/keys/{key}/extend", {"ttl_seconds": 7200})
    assert status == 200 and extended["expires_at"] > minted["expires_at"]
    assert (extended["account_id"], extended["mint_decision_id"]) == (minted["account_id"], minted["mint_decision_id"])
    assert ask(client(gw, minted["token"], retries=0))  # the key still works on the same account
    for ttl in (59, 86401):
        status, _, refused = gw.api("POST", f"/control/v2/keys/{key}/extend", {"ttl_seconds": ttl})
        assert (status, refused["error"]["code"]) == (422, "invalid-request"), refused
    caller = mint(gw, driver=None, dispatch="d-2")
    status, _, refused = gw.api("POST", f"/control/v2/keys/{caller['key_id']}/extend", {"ttl_seconds": 600})
    assert (status, refused["error"]["code"]) == (409, "not-a-dispatch-key")
    status, _, refused = gw.api("POST", "/control/v2/keys/01J00000000000000000000000/extend", {})
    assert (status, refused["error"]["code"]) == (404, "decision-unknown")


# ---- leaseholdctl exec --------------------------------------------------------------------

CTL = [sys.executable, "-m", "controlplane.ctl"]
WORKER = """import os, sys, anthropic
sdk = anthropic.Anthropic(base_url=os.environ["ANTHROPIC_BASE_URL"], api_key=os.environ["ANTHROPIC_API_KEY"],
                          max_retries=2)
message = sdk.messages.create(model=sys.argv[1], max_tokens=8, messages=[{"role": "user", "content": "hi"}])
print("KEY", os.environ["ANTHROPIC_API_KEY"].split(".")[0], "TEXT", message.content[0].text)
"""


def exec_ctl(gw: Gateway, *flags: str) -> subprocess.CompletedProcess:
    env = base_env()
    env.update({"GATEWAY_CONTROL_URL": gw.control_url, "GATEWAY_CONTROL_TOKEN": gw.control_token})
    done = subprocess.run(
        [
            *CTL,
            "exec",
            "--repo",
            "acme/app",
            "--principal",
            "w-1",
            "--model",
            MODEL,
            *flags,
            "--",
            sys.executable,
            "-c",
            WORKER,
            MODEL,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def test_exec_mints_a_dispatch_key_and_prints_each_hop(make_gateway, tmp_path, clean_stub, second_stub) -> None:
    gw = pool(make_gateway, tmp_path, second_stub)
    clean_stub.script({"status": 529})
    done = exec_ctl(gw, "-v")
    assert done.returncode == 0, done.stderr
    assert "fallback driven by the gateway" in done.stderr
    assert f"hop 1: {A} -> {B} (overloaded" in done.stderr
    key_id = done.stdout.split("KEY lhgw_", 1)[1].split()[0]
    assert [r["account_id"] for r in rows_of(gw, key_id, 2)] == [A, B]


def test_exec_in_caller_mode_never_hops(make_gateway, tmp_path, clean_stub, second_stub) -> None:
    gw = pool(make_gateway, tmp_path, second_stub)
    clean_stub.script({"status": 529})
    done = exec_ctl(gw, "-v", "--fallback-driver", "caller")
    assert done.returncode == 0, done.stderr
    assert "hop 1" not in done.stderr and second_stub.requests() == []


def test_the_extender_keeps_a_dispatch_key_alive_past_its_ttl(
    make_gateway, tmp_path, clean_stub, second_stub, monkeypatch
) -> None:
    """exec's extender, in-process against the real daemons, on a short period: each extension
    moves the expiry; once it stops, nothing does."""
    from controlplane.cli import supervise
    from controlplane.cli.client import Client, choose_token

    gw = pool(make_gateway, tmp_path, second_stub)
    minted = mint(gw)
    monkeypatch.setattr(supervise, "extend_every_s", lambda ttl_s: 0.05)
    client = Client(gw.control_url, choose_token(gw.control_token, {}))
    extender = supervise.Extender(client, minted["key_id"], 7200)
    extender.start()
    try:
        wait_until(lambda: extender.extended >= 3, 15, "three extensions")
    finally:
        extender.stop()
        extender.join(10)
    assert extender.expires_at is not None and extender.expires_at > minted["expires_at"]
    assert ask(client_for(gw, minted["token"]))


def client_for(gw: Gateway, token: str) -> anthropic.Anthropic:
    return client(gw, token, retries=0)


@pytest.mark.parametrize(
    "ttl_s,every_s",
    [(60, 20.0), (3600, 1200.0), (9, 5.0)],
    ids=["a minute's key every 20 s", "an hour's every 20 min", "never under the floor"],
)
def test_extend_period(ttl_s: int, every_s: float) -> None:
    from controlplane.cli.supervise import extend_every_s

    assert extend_every_s(ttl_s) == every_s


def test_a_key_whose_decision_was_forgotten_stays_put_instead_of_pending(
    make_gateway, tmp_path, clean_stub, second_stub
) -> None:
    """A key whose decision is lost (its journal, `lease-decisions.jsonl`, removed while control
    was down: SPEC §5 keeps it otherwise, `tests/system/test_decisions_restart.py`): a 429 cannot
    hop (no decision to cite), and the key must serve on where it is, never stay
    `fallback-pending`."""
    gw = pool(make_gateway, tmp_path, second_stub)
    minted = mint(gw)
    gw.control.stop()
    (gw.state_dir / "lease-decisions.jsonl").unlink()
    gw.start_control()
    gw.wait_synchronised()
    clean_stub.script({"status": 429, "headers": {"retry-after": "1"}})
    assert ask(client(gw, minted["token"], retries=4))  # 429, then the key serves on at A
    rows = rows_of(gw, minted["key_id"], 2)
    assert [r["account_id"] for r in rows if r["status"] != "refused"] == [A, A]
