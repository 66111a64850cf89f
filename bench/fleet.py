"""Fleet mode's published bounds (SPEC §16), measured: three pairs and one redis-server on loopback.

`python -m bench.fleet [--rounds N] [--json] [--cost-only]` starts a stub upstream, a redis-server and three
pairs (`gw-a`, `gw-b`, `gw-c`; host TTL 3 s), and measures:

- `disable_to_held_ms`: from a `PATCH .../state disabled` sent to host A until host B's mint
  decision (explain: the same gather and `decide_mint` as a mint) holds — B polls meanwhile;
- `revoke_to_refused_ms`: from `revoke-leases` sent to A until every host's data plane refuses
  the account's key it served (401), each polled meanwhile; and the answer's own latency;
- `circuit_to_skipped_ms`: from the request that opens a circuit on A (its third 529) sent until
  B's decision skips the account `circuit-open` (the circuit closes by a probe between rounds);
- `budget_to_refused_ms`: from the request on A that exhausts a repo's budget (sent) until B's data
  plane refuses a lease of that repo 429 `budget-exhausted` — B probes with requests the stub
  answers 400 (no usage, no spend), so only A's spend can exhaust the budget (SPEC §18);
- `dead_host_slots_back_ms`: from SIGKILL of the pair holding an account's only slot until
  another host mints on it (bounded by the host TTL + one heartbeat: 3 s + 1 s here);
- `mint_ms`: a v2 mint (+ its revoke) on one pair in embedded mode vs on host A of the
  three-pair fleet, sequential, through an HTTP client from outside, the two interleaved in
  rounds; `added_ms` the difference of the medians;
- `request_ms`: a request to an account with a request ceiling (`request_capacity`, so the data
  plane asks the fleet's Redis for its slot), sequential on one keep-alive connection through an
  HTTP client from outside, embedded vs host A of the fleet, interleaved; `added_ms` likewise.
  (`bench.fleet_requests` measures the same on one fleet pair with a Redis of its own.)
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import fleet_requests
from bench.stats import summarize_ms
from tests.support.fleetpairs import MODEL, FleetPairs, accounts_toml, call, mint
from tests.support.harness import Gateway, Stub, credential_like
from tests.support.redis_server import RedisServer
from tests.support.waits import wait_until

ADMIN = "/control/v2/accounts"
POLL_S = 0.0005


def explain(gw: Gateway, repo: str) -> dict[str, Any]:
    return gw.api("GET", f"/control/v2/policy/explain?repo_slug={repo}&model={MODEL}")[2]["would_select"]


def narrow(gw: Gateway, repo: str, account: str) -> None:
    revision = gw.api("GET", "/control/v2/policy")[2]["revision"]
    status, _, body = gw.api(
        "PUT",
        "/control/v2/policy/level",
        {
            "name": f"repo:{repo}",
            "expected_revision": revision,
            "reason": "bench",
            "document": {"account_order": [account]},
        },
    )
    assert status == 200, body


def first_true(probe: Any, started: list[float], stop: threading.Event) -> list[float]:
    """Poll `probe` on a thread; the time it first answers True lands in the returned list."""
    seen: list[float] = []

    def run() -> None:
        while not stop.is_set():
            if started and probe():
                seen.append(time.perf_counter())
                return
            time.sleep(POLL_S)

    threading.Thread(target=run, daemon=True).start()
    return seen


def disable_to_held(fleet: FleetPairs, rounds: int) -> list[float]:
    a, b = fleet[0], fleet[1]
    narrow(a, "bench/admin", "team-b")
    samples = []
    for _ in range(rounds):
        assert a.api("PATCH", f"{ADMIN}/team-b/state", {"state": "enabled", "reason": "bench"})[0] == 200
        wait_until(lambda: explain(b, "bench/admin")["outcome"] == "selected", 5, "enabled on B")
        started: list[float] = []
        stop = threading.Event()
        seen = first_true(lambda: explain(b, "bench/admin")["outcome"] == "held", started, stop)
        started.append(time.perf_counter())
        assert a.api("PATCH", f"{ADMIN}/team-b/state", {"state": "disabled", "reason": "bench"})[0] == 200
        wait_until(lambda: seen, 5, "B to hold")
        stop.set()
        samples.append(seen[0] - started[0])
    a.api("PATCH", f"{ADMIN}/team-b/state", {"state": "enabled", "reason": "bench"})
    return samples


def revoke_to_refused(fleet: FleetPairs, rounds: int) -> tuple[list[float], list[float]]:
    everyone, answered = [], []
    for n in range(rounds):
        keys = [(gw, mint(gw, f"rv-{n}-{i}", repo_slug="bench/revoke")[2]) for i, gw in enumerate(fleet.pairs)]
        assert all(m["account_id"] == "team-a" for _, m in keys) and all(
            call(gw, m["token"])[0] == 200 for gw, m in keys
        )
        started: list[float] = []
        stop = threading.Event()
        seens = [first_true(lambda gw=gw, m=m: call(gw, m["token"])[0] == 401, started, stop) for gw, m in keys]
        started.append(time.perf_counter())
        status, _, body = fleet[0].api("POST", f"{ADMIN}/team-a/revoke-leases", {"reason": "bench"})
        answered.append(time.perf_counter() - started[0])
        assert status == 200 and body["unacknowledged_hosts"] == [], body
        wait_until(lambda: all(seens), 10, "every data plane to refuse")
        stop.set()
        everyone.append(max(s[0] for s in seens) - started[0])
    return everyone, answered


def circuit_to_skipped(fleet: FleetPairs, rounds: int) -> list[float]:
    a, b = fleet[0], fleet[1]
    narrow(a, "bench/circuit", "team-c")
    samples = []
    for n in range(rounds):
        wait_until(lambda: explain(b, "bench/circuit")["outcome"] == "selected", 10, "the circuit admitting")
        lease = mint(a, f"circ-{n}", repo_slug="bench/circuit")[2]
        for _ in range(2):
            assert call(a, lease["token"], '{"status": 529}')[0] == 529
        started: list[float] = []
        stop = threading.Event()
        seen = first_true(
            lambda: any(s["code"] == "circuit-open" for s in explain(b, "bench/circuit")["skipped"]), started, stop
        )
        started.append(time.perf_counter())
        assert call(a, lease["token"], '{"status": 529}')[0] == 529
        wait_until(lambda: seen, 5, "B to skip the open circuit")
        stop.set()
        samples.append(seen[0] - started[0])
        assert a.revoke(lease["key_id"])
        probe = wait_until(
            lambda: (m := mint(a, f"probe-{n}", repo_slug="bench/circuit")[2]).get("key_id") and m,
            10,
            "the probe lease",
        )  # half-open after the 1 s cooldown
        assert call(a, probe["token"])[0] == 200 and a.revoke(probe["key_id"])  # its success closes it
    return samples


BUDGET_USD = 0.00015  # the second priced request (0.00010185 each) exhausts it
PRICES = '[[price]]\nmodels = ["team-*"]\ninput = 3.0\noutput = 15.0\ncache_read = 0.3\ncache_creation = 3.75\n'
FREE = '{"status": 400}'  # the stub's answer without usage: an attempt that spends nothing


def budget_to_refused(fleet: FleetPairs, rounds: int) -> list[float]:
    a, b = fleet[0], fleet[1]
    samples = []
    for n in range(rounds):
        repo = f"bench/budget-{n}"
        revision = a.api("GET", "/control/v2/policy")[2]["revision"]
        status, _, body = a.api(
            "PUT",
            "/control/v2/policy/level",
            {
                "name": f"repo:{repo}",
                "expected_revision": revision,
                "reason": "bench",
                "document": {"budgets": [{"window": "month", "usd": BUDGET_USD}]},
            },
        )
        assert status == 200, body
        wait_until(lambda: b.api("GET", "/control/v2/policy")[2]["revision"] > revision, 5, "B folds the budget")
        on_b = mint(b, f"bud-b-{n}", repo_slug=repo)[2]
        on_a = mint(a, f"bud-a-{n}", repo_slug=repo)[2]
        assert call(a, on_a["token"])[0] == 200 and call(b, on_b["token"], FREE)[0] == 400
        started: list[float] = []
        stop = threading.Event()
        seen = first_true(lambda: call(b, on_b["token"], FREE)[0] == 429, started, stop)
        started.append(time.perf_counter())
        assert call(a, on_a["token"])[0] == 200
        wait_until(lambda: seen, 10, "B to refuse the exhausted budget")
        stop.set()
        samples.append(seen[0] - started[0])
        assert a.revoke(on_a["key_id"]) and b.revoke(on_b["key_id"])
    return samples


def dead_host_slots_back(fleet: FleetPairs, rounds: int) -> list[float]:
    narrow(fleet[0], "bench/dead", "team-d")
    samples = []
    for n in range(rounds):
        c = fleet[2]
        lease = mint(c, f"dead-{n}", repo_slug="bench/dead")[2]
        assert lease["account_id"] == "team-d", lease
        killed = time.perf_counter()
        for proc in (c.dataplane, c.control):
            proc.stop(signal.SIGKILL)
        back = wait_until(
            lambda: (
                (m := mint(fleet[0], f"back-{n}-{time.perf_counter()}", repo_slug="bench/dead")[2]).get("account_id")
                == "team-d"
                and m
            ),
            20,
            "the slot back",
        )
        samples.append(time.perf_counter() - killed)
        assert fleet[0].revoke(back["key_id"])
        c.start()  # its journal's lease fits again at re-registration (the slot is free)
        c.revoke(lease["key_id"])
        fleet.wait_hosts_live(3, among=[fleet[0]])
    return samples


def mint_cost(gw: Gateway, rounds: int, first: int = 0) -> list[float]:
    samples = []
    for n in range(first, first + rounds):
        started = time.perf_counter()
        status, _, body = mint(gw, f"cost-{n}", repo_slug="bench/cost")
        assert status == 201, body
        assert gw.revoke(body["key_id"])
        samples.append(time.perf_counter() - started)
    return samples


def interleaved(
    gateways: dict[str, Gateway], rounds: int, each: int, measure: Callable[[str, Gateway, int], list[float]]
) -> dict[str, list[float]]:
    """`measure(mode, gw, n)` `each` times per mode per round, the modes in turn (the machine's
    drift falls on every mode alike); the first round is a warm-up, dropped."""
    samples: dict[str, list[float]] = {mode: [] for mode in gateways}
    for index in range(rounds + 1):
        for mode, gw in gateways.items():
            got = measure(mode, gw, index * each)
            if index:
                samples[mode] += got
    return samples


def request_cost(gateways: dict[str, Gateway], rounds: int, each: int) -> dict[str, list[float]]:
    """Sequential requests to the request-ceilinged account, one keep-alive connection per mode."""
    conns = {}
    for mode, gw in gateways.items():
        host, port = gw.dataplane_url.removeprefix("http://").split(":")
        conns[mode] = (fleet_requests._mint(gw, CAPPED_MODEL), http.client.HTTPConnection(host, int(port)))
    try:
        return interleaved(
            gateways,
            rounds,
            each,
            lambda mode, _gw, _n: [
                fleet_requests._timed(conns[mode][1], conns[mode][0], CAPPED_MODEL) / 1000 for _ in range(each)
            ],
        )
    finally:
        for _, conn in conns.values():
            conn.close()


def added(samples: dict[str, list[float]]) -> dict[str, Any]:
    out: dict[str, Any] = {mode: summarize_ms(values) for mode, values in samples.items()}
    out["added_ms"] = round(out["fleet"]["p50"] - out["embedded"]["p50"], 3)
    return out


CAPPED_MODEL = "capped-1"
CAPPED = """
[[account]]
id = "capped"
provider_binding = "anthropic"
base_url = "{url}"
auth_style = "x-api-key"
credential_env = "GATEWAY_TEAM_B_KEY"
models = ["capped-*"]
request_capacity = 64
"""


EXTRA = """
[[account]]
id = "team-c"
provider_binding = "anthropic"
base_url = "{url}"
auth_style = "x-api-key"
credential_env = "GATEWAY_TEAM_B_KEY"
models = ["team-*"]

[[account]]
id = "team-d"
provider_binding = "anthropic"
base_url = "{url}"
auth_style = "x-api-key"
credential_env = "GATEWAY_TEAM_B_KEY"
models = ["team-*"]
lease_capacity = 1
"""


def run(rounds: int, work: Path, cost_only: bool = False) -> dict[str, Any]:
    stub = Stub(work / "stub", anthropic_key=credential_like("sk-ant-api03-"), openai_key=None)
    redis = RedisServer(work / "redis").start()
    results: dict[str, Any] = {}
    try:
        embedded = Gateway(
            work / "embedded",
            stub,
            {
                "GATEWAY_ACCOUNTS_FILE": str(_accounts(work, stub)),
                "GATEWAY_TEAM_A_KEY": stub.anthropic_key or "",
                "GATEWAY_TEAM_B_KEY": stub.anthropic_key or "",
            },
        ).start()
        fleet = None
        try:
            extra = EXTRA.format(url=stub.url) + CAPPED.format(url=stub.url)
            fleet = FleetPairs(
                work / "fleet",
                stub,
                redis,
                3,
                accounts=accounts_toml(stub, lease_capacity=None, extra=extra),
                extra_env={"GATEWAY_CIRCUIT_COOLDOWN_SECONDS": "1", "GATEWAY_PRICES_FILE": str(_prices(work))},
            ).start()
            both = {"embedded": embedded, "fleet": fleet[0]}
            results["mint_ms"] = added(interleaved(both, 5, rounds, lambda _m, gw, n: mint_cost(gw, rounds, n)))
            results["request_ms"] = added(request_cost(both, 5, rounds * 3))
        except BaseException:
            if fleet is not None:
                fleet.stop()
            raise
        finally:
            embedded.stop()
        try:
            if cost_only:
                return results
            results["disable_to_held_ms"] = summarize_ms(disable_to_held(fleet, rounds))
            everyone, answered = revoke_to_refused(fleet, rounds)
            results["revoke_to_refused_ms"] = summarize_ms(everyone)
            results["revoke_answer_ms"] = summarize_ms(answered)
            results["circuit_to_skipped_ms"] = summarize_ms(circuit_to_skipped(fleet, max(3, rounds // 2)))
            results["budget_to_refused_ms"] = summarize_ms(budget_to_refused(fleet, max(3, rounds // 2)))
            results["dead_host_slots_back_ms"] = summarize_ms(dead_host_slots_back(fleet, max(2, rounds // 10)))
        finally:
            fleet.stop()
    finally:
        redis.stop()
        stub.stop()
    return results


def _prices(work: Path) -> Path:
    path = work / "prices.toml"
    path.write_text(PRICES)
    return path


def _accounts(work: Path, stub: Stub) -> Path:
    path = work / "embedded-accounts.toml"
    work.mkdir(parents=True, exist_ok=True)
    path.write_text(accounts_toml(stub, lease_capacity=None, extra=CAPPED.format(url=stub.url)))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--cost-only", action="store_true", help="mint_ms and request_ms only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        results = run(args.rounds, Path(tmp), args.cost_only)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for name, value in results.items():
        print(f"{name:26} {json.dumps(value)}")


if __name__ == "__main__":
    main()
