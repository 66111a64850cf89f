"""Scenario: steering before the 429 (SPEC §22). `python -m bench.headroom [--requests N]`.

Two Anthropic accounts in one pool behind one gateway pair, each with its own rate limit kept by
a small provider simulator (`Provider`, below: a requests window per API key, the real
`anthropic-ratelimit-requests-*` headers on every answer, 429 with `retry-after` once the window
is spent). `team-a`, first in the pool, starts nearly exhausted (`A_REMAINING` of `A_LIMIT`
left); `team-b` has plenty. `WORKERS` workers each loop: mint a fresh dispatch (v2), send one
request, revoke. The run is made twice, each on a fresh gateway and a fresh simulator:

- `floor off` — today's behaviour: mints go to `team-a` until its 429s open its circuit;
- `floor 20 %` — the platform sets `min_headroom_percent: 20`: once an answer says `team-a` is
  below a fifth of its window, new mints skip it until the window resets.

It prints, per run, the requests sent, how many were answered 429, their share, and where the
requests went. The windows are long enough (`WINDOW_S`) that none resets inside a run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.support.harness import Gateway, credential_like, free_port, http

MODEL = "team-sonnet-1"
A_LIMIT, A_REMAINING, B_LIMIT = 50, 6, 100_000
WINDOW_S = 120
WORKERS = 4
FLOOR = 20


class Provider:
    """A requests window per API key, as a provider keeps one per account; runs in a thread."""

    def __init__(self, limits: dict[str, tuple[int, int]]) -> None:
        self.left = {key: remaining for key, (_limit, remaining) in limits.items()}
        self.limit = {key: limit for key, (limit, _remaining) in limits.items()}
        self.reset_at = time.time() + WINDOW_S
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    async def answer(self, request: web.Request) -> web.Response:
        key = request.headers.get("x-api-key", "")
        if key not in self.left:
            return web.json_response({"type": "error", "error": {"type": "authentication_error"}}, status=401)
        spent = self.left[key] <= 0
        if not spent:
            self.left[key] -= 1
        reset = datetime.fromtimestamp(int(self.reset_at), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        headers = {
            "anthropic-ratelimit-requests-limit": str(self.limit[key]),
            "anthropic-ratelimit-requests-remaining": str(self.left[key]),
            "anthropic-ratelimit-requests-reset": reset,
        }
        if spent:
            headers["retry-after"] = str(max(1, int(self.reset_at - time.time())))
            return web.json_response(
                {"type": "error", "error": {"type": "rate_limit_error", "message": "rate limited"}},
                status=429,
                headers=headers,
            )
        return web.json_response(
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": MODEL,
                "content": [{"type": "text", "text": "ok"}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 5, "output_tokens": 1},
            },
            headers=headers,
        )

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/v1/messages", self.answer)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def accounts_toml(url: str) -> str:
    return "".join(
        f'''
[[account]]
id = "{name}"
provider_binding = "anthropic"
base_url = "{url}"
auth_style = "x-api-key"
credential_env = "GATEWAY_{name.upper().replace("-", "_")}_KEY"
models = ["team-*"]
'''
        for name in ("team-a", "team-b")
    )


def worker(gw: Gateway, index: int, count: int, tally: Counter, lock: threading.Lock) -> None:
    for n in range(count):
        status, _, minted = gw.api(
            "POST",
            "/control/v2/mint",
            {
                "dispatch_id": f"w{index}-{n}",
                "repo_slug": "bench/headroom",
                "principal_kind": "worker",
                "principal_id": f"w{index}",
                "model": MODEL,
            },
        )
        if status != 201:
            with lock:
                tally[f"mint {status} {minted.get('refusal_reason')}"] += 1
            continue
        answer, _, _ = http(
            "POST",
            gw.dataplane_url + "/v1/messages",
            {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
            {"x-api-key": minted["token"]},
        )
        gw.revoke(minted["key_id"])
        with lock:
            tally["requests"] += 1
            tally[f"{minted['account_id']} {answer}"] += 1
            if answer == 429:
                tally["429"] += 1


def run(workdir: Path, requests: int, floor: int) -> dict[str, Any]:
    key_a, key_b = credential_like("sk-ant-a-"), credential_like("sk-ant-b-")
    provider = Provider({key_a: (A_LIMIT, A_REMAINING), key_b: (B_LIMIT, B_LIMIT)})
    accounts = workdir / "accounts.toml"
    workdir.mkdir(parents=True, exist_ok=True)
    accounts.write_text(accounts_toml(provider.url))
    gw = Gateway(
        workdir / "gw",
        None,
        {
            "GATEWAY_ACCOUNTS_FILE": str(accounts),
            "GATEWAY_TEAM_A_KEY": key_a,
            "GATEWAY_TEAM_B_KEY": key_b,
            "GATEWAY_LOG_LEVEL": "warning",
        },
    )
    try:
        gw.start()
        if floor:
            status, _, body = gw.api(
                "PUT",
                "/control/v2/policy/level",
                {
                    "name": "platform",
                    "expected_revision": 0,
                    "document": {"min_headroom_percent": floor},
                    "reason": "bench",
                },
            )
            assert status == 200, body
        tally: Counter = Counter()
        lock = threading.Lock()
        per = requests // WORKERS
        threads = [threading.Thread(target=worker, args=(gw, i, per, tally, lock)) for i in range(WORKERS)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        tally["seconds"] = round(time.monotonic() - started, 1)
        return dict(tally)
    finally:
        gw.stop()
        provider.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-headroom-") as tmp:
        for name, floor in (("floor off", 0), (f"floor {FLOOR} %", FLOOR)):
            results[name] = run(Path(tmp) / name.replace(" ", "-").replace("%", "pct"), args.requests, floor)
    print(json.dumps(results, indent=2, sort_keys=True))
    print(f"\n{'run':<14} {'requests':>8} {'429':>5} {'share':>7}")
    for name, tally in results.items():
        sent = tally.get("requests", 0)
        print(f"{name:<14} {sent:>8} {tally.get('429', 0):>5} {tally.get('429', 0) / max(sent, 1):>7.1%}")


if __name__ == "__main__":
    main()
