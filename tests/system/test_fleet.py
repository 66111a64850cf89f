"""Fleet mode with real daemons (SPEC §16): two pairs on loopback share one redis-server, and
every promise holds for the fleet, not per host.

One module fleet (`gw-a`, `gw-b`; `team-a` with `lease_capacity = 2`, `team-b` without) serves the
tests that leave it as they found it; the circuit test has a fleet of its own (a circuit, once
open, stays open for its cooldown). Accounts serve `team-*` models only, so a mint never lands on
a legacy account.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.fleetpairs import (
    MODEL,
    FleetPairs,
    account,
    accounts,
    accounts_toml,
    call,
    fleet_of,
    mint,
)
from tests.support.harness import Gateway, Stub, base_env, http
from tests.support.redis_server import RedisServer
from tests.support.waits import wait_until
from tests.system.test_events import Feed

ADMIN = "/control/v2/accounts"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, stub: Stub, redis_server: RedisServer) -> Iterator[FleetPairs]:
    pairs = FleetPairs(tmp_path_factory.mktemp("fleet"), stub, redis_server, 2).start()
    yield pairs
    pairs.stop()


def set_state(gw: Gateway, account_id: str, state: str) -> dict:
    status, _, body = gw.api("PATCH", f"{ADMIN}/{account_id}/state", {"state": state, "reason": "test"})
    assert status == 200, body
    return body


def test_the_lease_ceiling_is_fleet_wide_and_one_live_lease_per_dispatch(fleet: FleetPairs) -> None:
    a, b = fleet[0], fleet[1]
    first, second = mint(a, "ceil-1")[2], mint(b, "ceil-2")[2]
    assert (first["account_id"], second["account_id"]) == ("team-a", "team-a")
    status, _, third = mint(a, "ceil-3")
    assert status == 201 and third["account_id"] == "team-b"  # no third lease of team-a, on host A
    assert {"account_id": "team-a", "position": 0, "code": "lease-capacity-exhausted"} in third["skipped"]
    view = account(b, "team-a")
    assert view["lease_count"] == 2
    assert {h["host_id"]: h["lease_count"] for h in view["hosts"]} == {"gw-a": 1, "gw-b": 1}
    status, _, again = mint(b, "ceil-1")  # the dispatch has a live lease on A
    assert (status, again["outcome"], again["refusal_reason"]) == (503, "held", "fallback-lease-still-held")
    for gw, minted in ((a, first), (b, second), (a, third)):
        assert gw.revoke(minted["key_id"])
    assert account(a, "team-a")["lease_count"] == 0


def test_a_citation_is_answered_on_another_host(fleet: FleetPairs) -> None:
    a, b = fleet[0], fleet[1]
    first = mint(a, "cite-1")[2]
    status, headers, _ = call(a, first["token"], '{"status": 429, "headers": {"retry-after": "1"}}')
    assert status == 429
    assert a.revoke(first["key_id"])
    status, _, retry = mint(b, "cite-1", retry_of_mint_decision_id=first["mint_decision_id"])
    assert status == 201, retry
    assert (retry["account_id"], retry["fallback_position"], retry["hop"]) == ("team-b", 1, 1)
    assert b.revoke(retry["key_id"])


def test_a_disable_drain_and_enable_on_one_host_hold_on_the_other(fleet: FleetPairs) -> None:
    a, b = fleet[0], fleet[1]
    feed = Feed(b, fleet.control_token)
    try:
        for state, code in (("disabled", "administrative-disabled"), ("draining", "administrative-draining")):
            set_state(a, "team-a", state)
            status, _, body = mint(b, f"admin-{state}")  # at once: B reads the chain before each mint
            assert body["account_id"] == "team-b" and body["skipped"][0]["code"] == code, body
            assert b.revoke(body["key_id"])
            assert account(b, "team-a")["administrative_state"] == state
        set_state(a, "team-a", "enabled")
        status, _, body = mint(b, "admin-enabled")
        assert body["account_id"] == "team-a"
        assert b.revoke(body["key_id"])
        events = feed.wait_for(
            lambda es: sum(e["event"] == "account.state" for e in es) >= 3, "A's three account.state events in B's feed"
        )
        assert [e["data"]["state"] for e in events if e["event"] == "account.state"][-3:] == [
            "disabled",
            "draining",
            "enabled",
        ]
    finally:
        feed.close()
    mirror = Path(b.state_dir) / "account-admin.jsonl"  # B witnesses the chain A wrote
    assert len(mirror.read_text().splitlines()) >= 3


def test_a_policy_write_on_one_host_is_explained_on_the_other_and_a_stale_one_refused(fleet: FleetPairs) -> None:
    a, b = fleet[0], fleet[1]
    revision = a.api("GET", "/control/v2/policy")[2]["revision"]
    feed = Feed(b, fleet.control_token)
    try:
        put = {
            "name": "repo:acme/policy",
            "expected_revision": revision,
            "reason": "test",
            "document": {"account_order": ["team-b", "team-a"]},
        }
        status, _, body = a.api("PUT", "/control/v2/policy/level", put)
        assert status == 200, body
        status, _, explained = b.api("GET", f"/control/v2/policy/explain?repo_slug=acme/policy&model={MODEL}")
        assert status == 200 and explained["would_select"]["account_id"] == "team-b", explained
        status, _, stale = b.api("PUT", "/control/v2/policy/level", put)  # the same expected_revision
        assert status == 409 and stale["error"]["code"] == "revision-conflict"
        assert stale["error"]["current_revision"] == revision + 1
        feed.wait_for(
            lambda es: any(e["event"] == "policy" and e["data"]["revision"] == revision + 1 for e in es),
            "A's policy event in B's feed",
        )
    finally:
        feed.close()


def test_revoke_leases_ends_the_accounts_leases_on_every_host(fleet: FleetPairs) -> None:
    a, b = fleet[0], fleet[1]
    on_a, on_b = mint(a, "rl-1")[2], mint(b, "rl-2")[2]
    assert call(b, on_b["token"])[0] == 200
    status, _, body = a.api("POST", f"{ADMIN}/team-a/revoke-leases", {"reason": "test"})
    assert status == 200, body
    assert (body["revoked"], body["unacknowledged_hosts"]) == (2, [])
    assert call(b, on_b["token"])[0] == 401 and call(a, on_a["token"])[0] == 401  # already, on return
    assert account(a, "team-a")["lease_count"] == 0


def stream_slowly(gw: Gateway, token: str, done: dict) -> None:
    body = {"model": MODEL, "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    done["status"] = http(
        "POST",
        gw.dataplane_url + "/v1/messages",
        body,
        {"x-api-key": token, "x-stub-step": '{"stall_after_events": 2, "stall_s": 3}'},
    )[0]


def test_the_read_plane_counts_fleet_wide_and_names_each_host(fleet: FleetPairs) -> None:
    a, b = fleet[0], fleet[1]
    minted = mint(b, "read-1")[2]
    done: dict = {}
    streaming = threading.Thread(target=stream_slowly, args=(b, minted["token"], done))
    streaming.start()
    try:

        def seen_on_a() -> dict | None:
            view = account(a, "team-a")
            return view if view["in_flight_count"] == 1 else None

        view = wait_until(seen_on_a, 10, "B's attempt in flight, counted on A")  # B's next beat
        assert view["lease_count"] == 1 and view["leased"] and view["in_flight"]
        rows = {h["host_id"]: h for h in view["hosts"]}
        assert (rows["gw-b"]["lease_count"], rows["gw-b"]["in_flight_count"], rows["gw-a"]["lease_count"]) == (1, 1, 0)
        assert all(h["last_seen_at"].endswith("Z") for h in rows.values())
        assert accounts(a)["fleet"] == {"mode": "redis", "state": "available", "hosts_live": 2}
        metrics = a.api("GET", "/metrics")[2]
        assert "leasehold_fleet_hosts_live 2.0" in metrics
        assert 'leasehold_fleet_host_in_flight{host_id="gw-b"} 1.0' in metrics
        assert 'leasehold_fleet_host_leases{host_id="gw-b"} 1.0' in metrics
    finally:
        streaming.join(15)
    assert done["status"] == 200
    fleet_view = fleet_of(a)
    assert [(h["host_id"], h["live"], h["this_host"]) for h in fleet_view["hosts"]] == [
        ("gw-a", True, True),
        ("gw-b", True, False),
    ]
    env = {**base_env(), "GATEWAY_CONTROL_URL": a.control_url, "GATEWAY_CONTROL_TOKEN": fleet.control_token}
    done_ctl = subprocess.run(
        [sys.executable, "-m", "controlplane.ctl", "fleet"], env=env, capture_output=True, text=True, timeout=30
    )
    assert done_ctl.returncode == 0, done_ctl.stderr
    assert "2 host(s) live" in done_ctl.stdout and "gw-a (this host)" in done_ctl.stdout and "gw-b" in done_ctl.stdout
    assert b.revoke(minted["key_id"])


def test_a_second_pair_with_a_live_host_id_is_refused(fleet: FleetPairs, tmp_path: Path) -> None:
    twin = Gateway(tmp_path / "twin", fleet.stub, {**fleet.shared_env, "GATEWAY_HOST_ID": "gw-a"})
    from tests.support.harness import Proc

    proc = Proc([sys.executable, "-m", "controlplane.main"], twin.env, tmp_path / "twin.log")
    try:
        assert proc.popen.wait(30) == 2
    finally:
        proc.stop()
    assert "GATEWAY_HOST_ID=gw-a" in proc.output()
    assert not (twin.runtime_dir / "control.sock").exists()  # its data plane is never served
    assert fleet_of(fleet[0])["hosts_live"] == 2


@pytest.fixture
def circuit_fleet(tmp_path: Path, stub: Stub, redis_server: RedisServer) -> Iterator[FleetPairs]:
    pairs = FleetPairs(
        tmp_path,
        stub,
        redis_server,
        2,
        accounts=accounts_toml(stub, lease_capacity=None),
        extra_env={"GATEWAY_CIRCUIT_COOLDOWN_SECONDS": "1"},
    ).start()
    yield pairs
    pairs.stop()


def test_a_circuit_opened_on_one_host_keeps_the_others_mints_off_and_admits_one_probe(circuit_fleet) -> None:
    a, b = circuit_fleet[0], circuit_fleet[1]
    feed = Feed(b, circuit_fleet.control_token)
    try:
        minted = mint(a, "circ-1")[2]
        for _ in range(3):  # the third opens it for 2 s (the upstream's Retry-After beats the 1 s cooldown)
            assert call(a, minted["token"], '{"status": 529, "headers": {"retry-after": "2"}}')[0] == 529
        status, _, body = mint(b, "circ-2")
        assert body["account_id"] == "team-b" and body["skipped"][0]["code"] == "circuit-open", body
        assert account(b, "team-a")["circuit"]["state"] == "open"
        feed.wait_for(
            lambda es: any(e["event"] == "circuit" and e["data"]["state"] == "open" for e in es),
            "A's circuit event in B's feed",
        )
        assert a.revoke(minted["key_id"]) and b.revoke(body["key_id"])
        wait_until(lambda: account(b, "team-a")["circuit"]["state"] == "half-open", 10, "the circuit half-open")
        results: list[dict] = []
        racers = [
            threading.Thread(target=lambda gw=gw, n=n: results.append(mint(gw, f"probe-{n}")[2]))
            for n, gw in enumerate((a, b, a, b))
        ]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join(30)
        # one probe fleet-wide; a racer that lost the probe's claim after its decision is held
        # circuit-open (the claim decides, the decision's read was advisory), never a second probe
        assert [r.get("account_id") for r in results].count("team-a") == 1, results
        assert all(
            r.get("account_id") == "team-b" or r["skipped"][-1]["code"] == "circuit-open"
            for r in results
            if r.get("account_id") != "team-a"
        ), results
    finally:
        feed.close()


def test_no_secret_reaches_redis_a_log_line_or_a_fleet_payload(fleet: FleetPairs, redis_server: RedisServer) -> None:
    a, b = fleet[0], fleet[1]
    minted = mint(a, "secret-1")[2]
    assert call(a, minted["token"])[0] == 200
    payloads = [
        json.dumps(gw.api("GET", path)[2])
        for gw in (a, b)
        for path in ("/control/v2/fleet", "/control/v2/accounts", "/metrics")
    ]
    assert b.revoke(minted["key_id"]) is False and a.revoke(minted["key_id"])
    admin = redis.Redis(host="127.0.0.1", port=redis_server.port)
    blobs: list[bytes] = []
    for key in admin.scan_iter(match="{" + fleet.fleet_id + "}:*", count=1000):
        kind = admin.type(key).decode()
        blobs.append(key)
        if kind == "string":
            blobs.append(admin.get(key) or b"")
        elif kind == "hash":
            blobs.extend(b for pair in admin.hgetall(key).items() for b in pair)
        elif kind in ("set", "list", "zset"):
            blobs.extend(
                admin.smembers(key)
                if kind == "set"
                else admin.lrange(key, 0, -1)
                if kind == "list"
                else [m for m, _ in admin.zrange(key, 0, -1, withscores=True)]
            )
        elif kind == "stream":
            blobs.extend(b for _, fields in admin.xrange(key) for pair in fields.items() for b in pair)
    assert len(blobs) > 20  # the sweep is not vacuous
    haystack = b"\n".join(blobs).decode("utf-8", "replace") + "".join(payloads) + a.logs() + b.logs()
    assert minted["key_id"] in b"\n".join(blobs).decode("utf-8", "replace")
    for name, secret in {
        "control token": fleet.control_token,
        "provider key": fleet.stub.anthropic_key,
        "token": minted["token"],
        "secret half": minted["token"].split(".", 1)[1],
    }.items():
        assert secret not in haystack, name
