"""Dispatch keys (SPEC §17): how long a hop takes, and what a worker sees meanwhile.

`python -m bench.hop_latency [--rounds N]` starts a stub per account and one gateway pair
(`legacy-anthropic` then a sibling), then, each round, mints a dispatch key and a caller-driven
lease and sends a request each that the first account answers 429. It measures, on loopback:

- `failed_answer_ms`: the 429's latency as the worker sees it, dispatch key vs caller-driven lease
  (the hop runs before the failed answer is released, so this is the hop's cost to the worker);
- `failure_to_sibling_ms`: from the 429 reaching the worker to its immediate retry's answer
  from the sibling (the retry is sent at once, not after `retry-after`);
- `pending_answers`: how many `fallback-pending` answers the worker got meanwhile (0 when the
  hop completes before the failed answer is released, the designed case).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from tests.support.harness import Gateway, Stub, credential_like, http

MODEL = "claude-sonnet-4-6"
BODY = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
FAIL = '{"status": 429, "headers": {"retry-after": "1"}}'


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def _mint(gw: Gateway, dispatch: str, driver: str) -> dict:
    status, _, body = gw.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": dispatch,
            "repo_slug": "bench/hops",
            "principal_kind": "worker",
            "principal_id": "b",
            "model": MODEL,
            "fallback_driver": driver,
        },
    )
    assert status == 201, body
    return body


def _call(gw: Gateway, token: str, step: str | None = None) -> tuple[int, float]:
    headers = {"x-api-key": token}
    if step:
        headers["x-stub-step"] = step
    t0 = time.perf_counter()
    status, _, _ = http("POST", gw.dataplane_url + "/v1/messages", BODY, headers)
    return status, (time.perf_counter() - t0) * 1000


def measure(rounds: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        stub_a = Stub(work / "a", anthropic_key=credential_like("sk-ant-api03-"), openai_key=None)
        stub_b = Stub(work / "b", anthropic_key=credential_like("sk-ant-api03-"), openai_key=None)
        accounts = work / "accounts.toml"
        accounts.write_text(
            f'[[account]]\nid = "anthropic-b"\nprovider_binding = "anthropic"\n'
            f'base_url = "{stub_b.url}"\nauth_style = "x-api-key"\n'
            f'credential_env = "GATEWAY_ANTHROPIC_B_KEY"\nmodels = ["claude-*"]\n'
        )
        gw = Gateway(
            work / "gw",
            stub_a,
            {"GATEWAY_ACCOUNTS_FILE": str(accounts), "GATEWAY_ANTHROPIC_B_KEY": stub_b.anthropic_key},
        ).start()
        hop_fail, caller_fail, to_sibling, pending = [], [], [], 0
        try:
            for n in range(rounds):
                caller = _mint(gw, f"c{n}", "caller")
                status, ms = _call(gw, caller["token"], FAIL)
                assert status == 429
                caller_fail.append(ms)
                gw.revoke(caller["key_id"])
                key = _mint(gw, f"d{n}", "gateway")
                status, ms = _call(gw, key["token"], FAIL)
                assert status == 429
                hop_fail.append(ms)
                t0 = time.perf_counter()
                while True:
                    status, _ = _call(gw, key["token"])
                    if status != 503:
                        break
                    pending += 1
                assert status == 200
                to_sibling.append((time.perf_counter() - t0) * 1000)
                gw.revoke(key["key_id"])
        finally:
            gw.stop()
            stub_a.stop()
            stub_b.stop()

    def summary(values: list[float]) -> dict:
        return {"p50": round(_pct(values, 0.5), 3), "p99": round(_pct(values, 0.99), 3)}

    return {
        "rounds": rounds,
        "failed_answer_ms": {"dispatch_key": summary(hop_fail), "caller_driven": summary(caller_fail)},
        "failure_to_sibling_ms": summary(to_sibling),
        "pending_answers": pending,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    print(json.dumps(measure(parser.parse_args().rounds), indent=2))


if __name__ == "__main__":
    main()
