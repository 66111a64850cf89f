"""`make soak`: a bounded soak of the v1 surface, then the invariants that must still hold.

Usage: ``python -m bench.soak [--minutes 10] [--seconds S] [--seed N] [--workers 12]``;
``python -m bench.soak --fleet ...`` runs the fleet variant instead (`bench/soak_fleet.py`: three
pairs sharing one redis-server, faults injected, the fleet's invariants; its own options too).

Rule: every operation is drawn from a seeded mix and its expected terminal row is counted as
it is sent, so at the end the ledger can be checked exactly, not approximately. The mix:
non-streaming calls, streams, streams the client aborts after the first chunk, upstream 429,
500 and mid-stream resets (scripted per request through the stub's ``x-stub-step``), mints,
revokes of retired keys (a key is retired from use before it is revoked, so no request races
its revocation) and calls with revoked keys (401, and never a row).

Invariants checked at the end (exit status 1 if any fails):
- ledger rows == attempts accepted, one row per attempt id, and per kind the expected status
  and condition (completed, upstream-error/rate-limited, upstream-error/upstream-unavailable,
  transport-error, client-aborted);
- nothing in flight: `/control/v2/routes/active` is empty;
- RSS of each daemon grew less than 5% between the end of warm-up (a fifth of the run) and the end.
Alongside, `bench/soak_v2.py` runs dispatches through a two-account pool (v2 mints, fallbacks
after a scripted 429, renewals, supersedes) while an operator drains and re-enables the second
account and rewrites the repo's routing policy; its invariants: never two live leases for one
dispatch, lease and in-flight counts back to what is held, both chains verified with one record
per write, no operator write refused.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench import soak_v2
from bench.procs import MINT_BODY, rss_kib
from tests.support.harness import Gateway, Stub, credential_like, wait_until

MODEL = "claude-sonnet-4-6"
RSS_GROWTH_LIMIT = 0.05
RSS_MIN_SECONDS = 60  # shorter runs are still warming up: RSS growth is reported, not judged
LIVE_KEYS = 4
# kind -> (weight, x-stub-step, stream, expected (status, condition) of the row)
MIX: dict[str, tuple[int, dict[str, Any] | None, bool, tuple[str, str | None]]] = {
    "json": (40, None, False, ("completed", None)),
    "stream": (30, {"deltas": 20}, True, ("completed", None)),
    "abort": (8, {"deltas": 20, "stall_between_events_s": 0.05}, True, ("client-aborted", None)),
    "429": (6, {"status": 429, "headers": {"retry-after": "1"}}, False, ("upstream-error", "rate-limited")),
    "500": (6, {"status": 500}, False, ("upstream-error", "upstream-unavailable")),
    "reset": (6, {"deltas": 20, "cut_after_events": 4}, True, ("transport-error", "transport-error")),
    "revoked": (4, None, False, ("", None)),  # 401, no row
}


class Soak:
    def __init__(self, gw: Gateway, seed: int, workers: int) -> None:
        self.gw = gw
        self.rng = random.Random(seed)
        self.workers = workers
        self.live: list[dict[str, Any]] = []
        self.in_use: collections.Counter[str] = collections.Counter()
        self.revoked_tokens: list[str] = []
        self.expected: collections.Counter[tuple[str, str | None]] = collections.Counter()
        self.sent: collections.Counter[str] = collections.Counter()
        self.surprises: list[str] = []
        self.mints = self.revokes = 0
        self.seconds = 0.0
        self.v2_results: list[tuple[str, bool, str]] = []
        self.lanes: list[soak_v2.DispatchLane] = []

    async def mint(self, session: aiohttp.ClientSession) -> None:
        async with session.post(
            self.gw.control_url + "/control/v1/keys",
            json=MINT_BODY,
            headers={"Authorization": f"Bearer {self.gw.control_token}"},
        ) as r:
            body = await r.json()
            if r.status != 201:
                self.surprises.append(f"mint answered {r.status}")
                return
        self.live.append(body)
        self.mints += 1

    async def retire_one(self, session: aiohttp.ClientSession) -> None:
        """Take the oldest key out of use, wait for its requests, revoke it."""
        key = self.live.pop(0)
        deadline = time.monotonic() + 30
        while self.in_use[key["key_id"]] and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        async with session.delete(
            self.gw.control_url + f"/control/v1/keys/{key['key_id']}",
            headers={"Authorization": f"Bearer {self.gw.control_token}"},
        ) as r:
            if r.status != 200 or (await r.json()).get("revoked") is not True:
                self.surprises.append(f"revoke answered {r.status}")
        self.revoked_tokens.append(key["token"])
        self.revokes += 1

    async def one(self, session: aiohttp.ClientSession, kind: str) -> None:
        _, step, stream, expect = MIX[kind]
        if kind == "revoked":
            if not self.revoked_tokens:
                return
            token, key_id = self.rng.choice(self.revoked_tokens), None
        else:
            key = self.rng.choice(self.live)
            token, key_id = key["token"], key["key_id"]
            self.in_use[key_id] += 1
            self.expected[expect] += 1
        self.sent[kind] += 1
        headers = {"x-api-key": token, "anthropic-version": "2023-06-01"}
        if step is not None:
            headers["x-stub-step"] = json.dumps(step)
        body = {"model": MODEL, "max_tokens": 16, "stream": stream, "messages": [{"role": "user", "content": "soak"}]}
        try:
            await self._exchange(session, kind, headers, body)
        finally:
            if key_id is not None:
                self.in_use[key_id] -= 1

    async def _exchange(
        self, session: aiohttp.ClientSession, kind: str, headers: dict[str, str], body: dict[str, Any]
    ) -> None:
        try:
            async with session.post(self.gw.dataplane_url + "/v1/messages", json=body, headers=headers) as r:
                want = {"revoked": 401, "429": 429, "500": 500}.get(kind, 200)
                if r.status != want:
                    self.surprises.append(f"{kind}: HTTP {r.status}")
                if kind == "abort":
                    await r.content.readany()
                    r.close()  # the worker gives up mid-stream
                    return
                await r.read()
                if kind == "reset":
                    self.surprises.append("reset: the cut stream ended cleanly")
        except aiohttp.ClientPayloadError:
            if kind != "reset":
                self.surprises.append(f"{kind}: stream broken")

    async def run(self, seconds: float, on_warm, on_sample=lambda at_s, attempts: None) -> None:
        self.seconds = seconds
        kinds = list(MIX)
        weights = [MIX[k][0] for k in kinds]
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            for _ in range(LIVE_KEYS):
                await self.mint(session)
            stop_at = time.monotonic() + seconds
            warm_at = time.monotonic() + seconds / 5

            async def worker() -> None:
                while time.monotonic() < stop_at:
                    await self.one(session, self.rng.choices(kinds, weights)[0])

            async def key_churn() -> None:
                warmed = False
                next_sample = time.monotonic()
                while time.monotonic() < stop_at:
                    await asyncio.sleep(0.5)
                    await self.mint(session)
                    await self.retire_one(session)
                    if not warmed and time.monotonic() >= warm_at:
                        warmed = True
                        on_warm()
                    if time.monotonic() >= next_sample:
                        next_sample += seconds / 10
                        on_sample(seconds - (stop_at - time.monotonic()), sum(self.expected.values()))

            control = soak_v2.Control(self.gw, session)
            self.lanes = [
                soak_v2.DispatchLane(f"lane{i}", self.gw, control, random.Random(self.rng.random())) for i in range(2)
            ]
            operator = soak_v2.Operator(control)
            loop_stop = asyncio.get_running_loop().time() + seconds
            await asyncio.gather(
                key_churn(),
                *(worker() for _ in range(self.workers)),
                *(lane.run(loop_stop) for lane in self.lanes),
                operator.run(loop_stop),
            )
            self.v2_results = await soak_v2.final_checks(control, operator, self.lanes, len(self.live))

    def expected_rows(self) -> collections.Counter[tuple[str, str | None]]:
        total = collections.Counter(self.expected)
        for lane in self.lanes:
            total.update(lane.expected)
        return total


def check(gw: Gateway, soak: Soak, rss_warm: dict[str, int | None]) -> list[tuple[str, bool, str]]:
    """(invariant, held, detail) for every invariant of the module docstring."""
    expected = soak.expected_rows()
    total = sum(expected.values())
    try:
        rows = wait_until(lambda: (r := gw.ledger()) and len(r) >= total and r, 60, f"{total} ledger rows")
    except AssertionError:
        rows = gw.ledger()
    got = collections.Counter((r["status"], r["condition"]) for r in rows)
    ids = [r["attempt_id"] for r in rows]
    active = gw.active().get("count")
    rss_end = {name: rss_kib(p.popen.pid) for name, p in (("dataplane", gw.dataplane), ("control", gw.control))}
    growth = {
        n: None if not rss_warm.get(n) or not rss_end[n] else (rss_end[n] - rss_warm[n]) / rss_warm[n] for n in rss_end
    }
    judged = soak.seconds >= RSS_MIN_SECONDS
    return [
        ("ledger rows == attempts accepted", len(rows) == total, f"{len(rows)} rows, {total} attempts"),
        ("one row per attempt id", len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} duplicates"),
        (
            "rows by status/condition as sent",
            got == expected,
            ", ".join(f"{s}/{c}: {got[(s, c)]} of {n}" for (s, c), n in sorted(expected.items(), key=str)),
        ),
        ("nothing in flight", active == 0, f"{active} active routes"),
        ("no unexpected answer", not soak.surprises, "; ".join(soak.surprises[:5]) or "none"),
        *(
            (
                f"{name} RSS growth < 5% after warm-up",
                not judged or (g is not None and g < RSS_GROWTH_LIMIT),
                f"{rss_warm.get(name)} → {rss_end[name]} KiB ({'—' if g is None else f'{100 * g:+.1f}%'})"
                + ("" if judged else f"; not judged under {RSS_MIN_SECONDS} s"),
            )
            for name, g in growth.items()
        ),
        *soak.v2_results,
    ]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--fleet" in argv:
        from bench import soak_fleet  # redis-server and three pairs: only when asked for

        return soak_fleet.main([a for a in argv if a != "--fleet"])
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--fleet",
        action="store_true",
        help="run the fleet variant (bench/soak_fleet.py; --fleet --help for its options)",
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=None, help="overrides --minutes")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--workers", type=int, default=12)
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else args.minutes * 60
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"soak: {seconds:.0f} s, seed {seed}, {args.workers} workers", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="leasehold-soak-"))
    stub = Stub(workdir / "stub", anthropic_key=credential_like("sk-ant-api03-"), openai_key=None)
    accounts = workdir / "accounts.toml"
    workdir.mkdir(parents=True, exist_ok=True)
    accounts.write_text(soak_v2.accounts_file(stub.url))
    gw = Gateway(
        workdir / "gw",
        stub,
        {"GATEWAY_ACCOUNTS_FILE": str(accounts), "GATEWAY_ANTHROPIC_SOAK_B_KEY": stub.anthropic_key or ""},
    )
    try:
        gw.start()
        soak = Soak(gw, seed, args.workers)
        rss_warm: dict[str, int | None] = {}

        def on_warm() -> None:
            assert gw.dataplane is not None and gw.control is not None
            rss_warm.update(dataplane=rss_kib(gw.dataplane.popen.pid), control=rss_kib(gw.control.popen.pid))

        timeline: list[str] = []

        def on_sample(at_s: float, attempts: int) -> None:
            assert gw.dataplane is not None and gw.control is not None
            timeline.append(
                f"{at_s:6.0f} s {attempts:>9,} attempts  dataplane {rss_kib(gw.dataplane.popen.pid)} KiB"
                f"  control {rss_kib(gw.control.popen.pid)} KiB"
            )

        asyncio.run(soak.run(seconds, on_warm, on_sample))
        results = check(gw, soak, rss_warm)
    finally:
        gw.stop()
        stub.stop()
    print(f"sent: {dict(soak.sent)}; mints {soak.mints}, revokes {soak.revokes}")
    print("RSS over the run:\n  " + "\n  ".join(timeline))
    return verdict("soak", results, seed, workdir, width=40)


def verdict(prog: str, results: list[tuple[str, bool, str]], seed: int, workdir: Path, width: int) -> int:
    """One line per invariant, the verdict, and the work directory kept only when one failed;
    the exit status."""
    for name, held, detail in results:
        print(f"  {'ok   ' if held else 'FAIL '} {name:<{width}} {detail}")
    failed = [n for n, held, _ in results if not held]
    print(f"{prog}: {'all invariants held' if not failed else f'{len(failed)} invariant(s) failed'} (seed {seed})")
    if failed:
        print(f"{prog}: logs and state kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
