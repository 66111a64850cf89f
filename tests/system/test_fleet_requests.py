"""A request ceiling holds for the fleet (SPEC §6, §16): two sidecar pairs on one redis-server,
one account with `request_capacity = 1`. A stream in flight on host A fills it for host B; Redis
down refuses B's request to the ceilinged account 503 `fleet-state-unavailable` while an account
without a ceiling keeps serving; Redis back, the ceiling is checked again by itself."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
from http.client import HTTPException
from pathlib import Path

import anthropic
import pytest

from tests.support.fleet import fleet_secret_file
from tests.support.harness import Gateway, Stub, http
from tests.support.redis_server import RedisServer
from tests.support.waits import wait_until

BODY = {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}


@pytest.fixture
def redis(tmp_path: Path):
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def capped_env(tmp_path: Path, stub: Stub, redis: RedisServer, capacity: int, fleet_id: str) -> dict[str, str]:
    """The environment every pair shares: one account, `capped`, with `request_capacity`."""
    accounts = tmp_path / f"accounts-{fleet_id}.toml"
    accounts.write_text(f'''
[[account]]
id = "capped"
provider_binding = "anthropic"
base_url = "{stub.url}"
auth_style = "x-api-key"
credential_env = "GATEWAY_CAPPED_KEY"
models = ["capped-*"]
request_capacity = {capacity}
''')
    return {
        "GATEWAY_ACCOUNTS_FILE": str(accounts),
        "GATEWAY_CAPPED_KEY": stub.anthropic_key or "",
        "GATEWAY_FLEET_REDIS_URL": redis.url,
        "GATEWAY_FLEET_ID": fleet_id,
        "GATEWAY_FLEET_HOST_TTL_SECONDS": "3",
        "GATEWAY_FLEET_SECRET_FILE": str(fleet_secret_file(tmp_path)),
    }


@pytest.fixture
def pairs(make_gateway, tmp_path: Path, stub: Stub, redis: RedisServer) -> tuple[Gateway, Gateway]:
    common = capped_env(tmp_path, stub, redis, 1, f"t{tmp_path.name[-20:].lower()}")
    a = make_gateway({**common, "GATEWAY_HOST_ID": "host-a"}, name="a").start()
    b = make_gateway({**common, "GATEWAY_HOST_ID": "host-b"}, name="b").start()
    return a, b


def mint(gw: Gateway, model: str, dispatch: str) -> str:
    status, _, body = gw.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": dispatch,
            "repo_slug": "acme/app",
            "principal_kind": "worker",
            "principal_id": "w",
            "model": model,
        },
    )
    assert status == 201, body
    return body["token"]


def call(gw: Gateway, token: str, model: str) -> tuple[int, dict]:
    status, headers, _ = http("POST", gw.dataplane_url + "/v1/messages", {"model": model, **BODY}, {"x-api-key": token})
    return status, headers


def test_a_request_ceiling_holds_across_hosts_and_fails_closed_without_redis(
    pairs: tuple[Gateway, Gateway], clean_stub: Stub, redis: RedisServer
) -> None:
    a, b = pairs
    on_a, on_b = mint(a, "capped-1", "d-a"), mint(b, "capped-1", "d-b")
    uncapped_b = mint(b, "claude-sonnet-4-6", "d-u")
    done: dict[str, str] = {}

    def slow_stream() -> None:
        sdk = anthropic.Anthropic(base_url=a.dataplane_url, api_key=on_a, max_retries=0)
        with sdk.messages.stream(
            model="capped-1",
            max_tokens=8,
            messages=[{"role": "user", "content": "x"}],
            extra_headers={"x-stub-step": '{"stall_after_events": 2, "stall_s": 2}'},
        ) as s:
            done["text"] = s.get_final_text()

    streaming = threading.Thread(target=slow_stream)
    streaming.start()
    try:
        wait_until(lambda: a.active()["count"] == 1, 10, "A's stream in flight")
        status, headers = call(b, on_b, "capped-1")
        assert (status, headers.get("retry-after")) == (429, "1")  # the fleet's one slot is A's
        wait_until(
            lambda: any(r["refusal_reason"] == "request-capacity-exhausted" for r in b.ledger()), 10, "B's refused row"
        )
    finally:
        streaming.join(30)
    assert done.get("text")
    wait_until(lambda: call(b, on_b, "capped-1")[0] == 200, 10, "B admitted once A's stream ended")

    redis.stop()
    status, headers = call(b, on_b, "capped-1")
    assert (status, headers.get("retry-after")) == (503, "1")
    wait_until(lambda: any(r["refusal_reason"] == "fleet-state-unavailable" for r in b.ledger()), 10, "B's refused row")
    assert call(b, uncapped_b, "claude-sonnet-4-6")[0] == 200  # no ceiling: served, Redis or not

    redis.start()
    wait_until(lambda: call(b, on_b, "capped-1")[0] == 200, 20, "the ceiling checked again once Redis is back")


def peak_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    peak = open_now = 0
    for _, step in edges:
        open_now += step
        peak = max(peak, open_now)
    return peak


def test_random_requests_across_three_hosts_and_a_kill_never_exceed_the_request_ceiling(
    make_gateway, tmp_path: Path, clean_stub: Stub, redis: RedisServer
) -> None:
    """Seeded: three pairs send overlapping streams to an account with `request_capacity = 2`
    while one pair is SIGKILLed mid-stream and restarted; the upstream never sees more than two
    of the account's requests at once (the stub's own arrival and last-byte times)."""
    seed = int(os.environ.get("FLEET_SEED", random.randrange(1 << 30)))
    print(f"FLEET_SEED={seed}")
    rng = random.Random(seed)
    common = capped_env(tmp_path, clean_stub, redis, 2, "rnd" + str(seed % 10_000))
    hosts = [make_gateway({**common, "GATEWAY_HOST_ID": f"h-{n}"}, name=f"r{n}").start() for n in range(3)]
    tokens = [mint(gw, "capped-1", f"rnd-{n}") for n, gw in enumerate(hosts)]
    statuses: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()

    def worker(n: int, wrng: random.Random) -> None:
        while not stop.is_set():
            step = {"deltas": wrng.randrange(2, 8), "stall_between_events_s": wrng.choice((0.01, 0.03, 0.06))}
            try:
                status, _, _ = http(
                    "POST",
                    hosts[n].dataplane_url + "/v1/messages",
                    {"model": "capped-1", "stream": True, **BODY},
                    {"x-api-key": tokens[n], "x-stub-step": json.dumps(step)},
                    timeout_s=10,
                )
            except (OSError, HTTPException):  # the host was killed under this request
                status = 0
            with lock:
                statuses.append(status)
            stop.wait(wrng.random() * 0.05)

    threads = [
        threading.Thread(target=worker, args=(n, random.Random(rng.random())), daemon=True)
        for n in range(3)
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: statuses.count(200) >= 10, 30, "requests served")
        victim = hosts[rng.randrange(3)]
        for proc in (victim.dataplane, victim.control):
            proc.stop(signal.SIGKILL)  # mid-stream: its holders stay until the fleet reaps them
        count = len(statuses)
        wait_until(lambda: len(statuses) >= count + 30, 30, "the survivors serving on")
        victim.start()
        count = statuses.count(200)
        wait_until(lambda: statuses.count(200) >= count + 15, 30, "the fleet serving after the restart")
    finally:
        stop.set()
        for thread in threads:
            thread.join(15)
    served = [
        (r["time"], r.get("last_sent_at") or r["time"]) for r in clean_stub.requests() if r.get("model") == "capped-1"
    ]
    assert len(served) >= 25
    assert peak_overlap(served) <= 2, (seed, peak_overlap(served))
    assert set(statuses) <= {0, 200, 401, 429, 503}, (seed, sorted(set(statuses)))
    assert statuses.count(429) > 0  # the ceiling was reached, not merely never approached
