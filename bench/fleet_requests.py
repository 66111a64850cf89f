"""Fleet mode's cost on the hot path (SPEC §16): a request to a ceilinged account asks Redis for
its slot; a request to an account without a ceiling must pay nothing.

`python -m bench.fleet_requests [--requests N]` starts one stub, one redis-server and two
gateway pairs on loopback, embedded and fleet, each with a ceilinged account (`request_capacity`)
and the uncapped legacy account, then sends the same sequential requests to each in
interleaved rounds and reports p50/p99 latency per (mode, account) and the fleet's added p50.
"""

from __future__ import annotations

import argparse
import http.client
import json
import tempfile
import time
from pathlib import Path

from tests.support.fleet import fleet_secret_file
from tests.support.harness import Gateway, Stub, credential_like
from tests.support.redis_server import RedisServer

BODY = json.dumps({"model": "", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def _mint(gw: Gateway, model: str) -> str:
    status, _, body = gw.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": "bench-" + model,
            "repo_slug": "bench/fleet",
            "principal_kind": "worker",
            "principal_id": "b",
            "model": model,
        },
    )
    assert status == 201, body
    return body["token"]


def _timed(conn: http.client.HTTPConnection, token: str, model: str) -> float:
    body = BODY.replace('"model": ""', f'"model": "{model}"')
    t0 = time.perf_counter()
    conn.request("POST", "/v1/messages", body, {"x-api-key": token, "content-type": "application/json"})
    response = conn.getresponse()
    response.read()
    assert response.status == 200, response.status
    return (time.perf_counter() - t0) * 1000


def measure(requests: int, rounds: int = 5) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        stub = Stub(work / "stub", anthropic_key=credential_like("sk-ant-api03-"), openai_key=None)
        redis = RedisServer(work / "redis").start()
        accounts = work / "accounts.toml"
        accounts.write_text(
            f'[[account]]\nid = "capped"\nprovider_binding = "anthropic"\nbase_url = "{stub.url}"\n'
            'auth_style = "x-api-key"\ncredential_env = "GATEWAY_CAPPED_KEY"\n'
            'models = ["capped-*"]\nrequest_capacity = 64\n'
        )
        common = {"GATEWAY_ACCOUNTS_FILE": str(accounts), "GATEWAY_CAPPED_KEY": stub.anthropic_key}
        gateways = {
            "embedded": Gateway(work / "embedded", stub, common).start(),
            "fleet": Gateway(
                work / "fleet",
                stub,
                {
                    **common,
                    "GATEWAY_FLEET_REDIS_URL": redis.url,
                    "GATEWAY_HOST_ID": "bench-a",
                    "GATEWAY_FLEET_SECRET_FILE": str(fleet_secret_file(work)),
                },
            ).start(),
        }
        samples: dict[tuple[str, str], list[float]] = {}
        try:
            targets = []
            for mode, gw in gateways.items():
                host, port = gw.dataplane_url.removeprefix("http://").split(":")
                for account, model in (("ceilinged", "capped-1"), ("uncapped", "claude-sonnet-4-6")):
                    targets.append(
                        (mode, account, model, _mint(gw, model), http.client.HTTPConnection(host, int(port)))
                    )
            for _ in range(rounds):  # interleaved: the machine's drift falls on every column alike
                for mode, account, model, token, conn in targets:
                    for _ in range(requests // rounds):
                        samples.setdefault((mode, account), []).append(_timed(conn, token, model))
        finally:
            for gw in gateways.values():
                gw.stop()
            redis.stop()
            stub.stop()
    table = {
        f"{mode}/{account}": {"p50_ms": round(_pct(v, 0.5), 3), "p99_ms": round(_pct(v, 0.99), 3)}
        for (mode, account), v in samples.items()
    }
    added = {
        account: round(table[f"fleet/{account}"]["p50_ms"] - table[f"embedded/{account}"]["p50_ms"], 3)
        for account in ("ceilinged", "uncapped")
    }
    return {"requests_per_column": requests, "latency": table, "fleet_added_p50_ms": added}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    print(json.dumps(measure(parser.parse_args().requests), indent=2))


if __name__ == "__main__":
    main()
