"""The load generator: one scenario per process, a JSON job in, a JSON result out.

Rule: the generator runs in its own process (pinned to its own core when the runner pins), so
it never shares an interpreter with a server it measures, and it reports its own CPU use next
to the servers' so a reader can check it was not the bottleneck. Scenarios:

- ``saturate``: closed loop, ``connections`` keep-alive sockets each sending back to back.
- ``slices``: closed loop over several columns at once, each driven in turn for a short slice
  (``order``), answers counted per column: the interleaved A/B with the finest grain.
- ``rate``: open loop at a fixed rate; latency counted from the moment each request is written.
- ``streams``: ``count`` streams started together; time to first body byte and to the end.
- ``hold``: ``count`` streams held open; prints a ``{"held": ...}`` line, waits for a line on
  stdin, then closes every socket (the servers see client aborts).
- ``mint_revoke``: sequential ``POST /control/v1/keys`` + ``DELETE`` round trips.

Usage: ``python -m bench.loadgen`` with the job as one JSON line on stdin (never in argv, where
any local user could read its tokens); the result is the last stdout line.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from bench.http1 import Answer, Http1Connection, build_request
from bench.stats import summarize_ms

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process from /proc, in seconds (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def context_switches(pid: int) -> int | None:
    """Voluntary + involuntary context switches of a process so far (None if it is gone)."""
    total = 0
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
    except OSError:
        return None
    return total


class CpuWindow:
    """CPU share (1.0 = one core busy) of this process and of watched pids over a window, and
    the watched pids' context switches (`switches()`): a process woken per message shows it."""

    def __init__(self, watch: dict[str, int]) -> None:
        self.watch = watch
        self.t0 = time.perf_counter()
        self.self0 = time.process_time()
        self.pids0 = {name: cpu_seconds(pid) for name, pid in watch.items()}
        self.switches0 = {name: context_switches(pid) for name, pid in watch.items()}
        self.switches1: dict[str, int | None] = {}

    def result(self) -> dict[str, float | None]:
        wall = max(time.perf_counter() - self.t0, 1e-9)
        out: dict[str, float | None] = {"generator": round((time.process_time() - self.self0) / wall, 3)}
        for name, pid in self.watch.items():
            before, after = self.pids0[name], cpu_seconds(pid)
            out[name] = None if before is None or after is None else round((after - before) / wall, 3)
            s0, s1 = self.switches0[name], context_switches(pid)
            self.switches1[name] = None if s0 is None or s1 is None else s1 - s0
        return out


def request_bytes(job: dict[str, Any], extra_headers: dict[str, str] | None = None) -> bytes:
    headers = dict(job.get("headers") or {})
    headers.update(extra_headers or {})
    body = (job.get("body") or "").encode()
    return build_request(job.get("method", "POST"), job["path"], f"{job['host']}:{job['port']}", headers, body)


async def open_many(host: str, port: int, count: int) -> list[Http1Connection]:
    """Open `count` connections, at most 200 handshakes at a time (the listen backlog)."""
    conns: list[Http1Connection] = []
    for start in range(0, count, 200):
        batch = min(200, count - start)
        conns += await asyncio.gather(*(Http1Connection.open(host, port) for _ in range(batch)))
    return conns


def _errors(answers: list[Answer]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for a in answers:
        if not a.ok:
            key = a.error or f"http-{a.status}"
            counts[key] = counts.get(key, 0) + 1
    return counts


# ---- scenarios --------------------------------------------------------------------------------


async def saturate(job: dict[str, Any]) -> dict[str, Any]:
    request = request_bytes(job)
    conns = await open_many(job["host"], job["port"], job["connections"])
    warmup_s, duration_s = job["warmup_s"], job["duration_s"]
    start = time.perf_counter()
    window_start, window_end = start + warmup_s, start + warmup_s + duration_s
    kept: list[Answer] = []
    failures: list[Answer] = []
    usage: dict[str, float | None] = {}
    switches: dict[str, int | None] = {}

    async def worker(conn: Http1Connection) -> None:
        while True:
            answer = await conn.send(request)
            if not answer.ok:
                failures.append(answer)
                if conn.closed:
                    return
            if answer.sent_at >= window_start and answer.done_at <= window_end:
                kept.append(answer)
            if answer.done_at >= window_end:
                return

    async def watch_window() -> None:
        await asyncio.sleep(window_start - time.perf_counter())
        window = CpuWindow(job.get("watch_pids") or {})
        await asyncio.sleep(window_end - time.perf_counter())
        usage.update(window.result())
        switches.update(window.switches1)

    watcher = asyncio.create_task(watch_window())
    await asyncio.gather(*(worker(c) for c in conns))
    await watcher
    for conn in conns:
        conn.close()
    ok = [a for a in kept if a.ok]
    return {
        "requests": len(ok),
        "rps": round(len(ok) / duration_s, 1),
        "latency_ms": summarize_ms([a.total_s for a in ok]),
        "errors": _errors(failures),
        "cpu": usage,
        "context_switches": switches,
        "connections": len(conns),
    }


def slice_windows(order: list[int], slice_s: float, settle_s: float) -> list[tuple[int, float]]:
    """The `slices` scenario's plan: (column, measured seconds) per slice, in `order`. Each slice
    drives one column for `slice_s`; its first `settle_s` (the pipeline filling after the switch)
    is not measured, nor is the drain after it (the in-flight answers of the 64 connections)."""
    if not 0 <= settle_s < slice_s:
        raise ValueError("settle_s must be shorter than slice_s")
    return [(column, slice_s - settle_s) for column in order]


async def slices(job: dict[str, Any]) -> dict[str, Any]:
    """Closed loop, finely interleaved: every column's connections open at once, then the columns
    take turns at saturation, `slice_s` each, in `order` (A B C C B A repeated), so a burst of
    the machine's load lasting longer than a few slices hits every column alike.

    Throughput counts the answers *completed* in each slice's measured window (after `settle_s`,
    up to the slice's end), which in a closed loop is the rate itself, with no edge bias; CPU per
    request reads the column's processes over the same windows.
    """
    columns = job["columns"]
    requests = [request_bytes({**job, **c}) for c in columns]
    conns = [await open_many(c["host"], c["port"], job["connections"]) for c in columns]
    done = [0] * len(columns)
    measured = [0.0] * len(columns)
    cpu_s: list[dict[str, float]] = [{} for _ in columns]
    per_slice: list[list[float]] = [[] for _ in columns]
    failures: list[Answer] = []

    async def drive(column: int, until: float, window: tuple[float, float]) -> int:
        completed = 0

        async def worker(conn: Http1Connection) -> None:
            nonlocal completed
            while time.perf_counter() < until:
                answer = await conn.send(requests[column])
                if not answer.ok:
                    failures.append(answer)
                    return
                if window[0] <= answer.done_at <= window[1]:
                    completed += 1

        await asyncio.gather(*(worker(c) for c in conns[column]))
        return completed

    for column in range(len(columns)):  # warm every column before the first measured slice
        await drive(column, time.perf_counter() + job["warmup_s"], (0.0, 0.0))
    for column, seconds in slice_windows(job["order"], job["slice_s"], job["settle_s"]):
        start = time.perf_counter()
        window_start, until = start + job["settle_s"], start + job["slice_s"]
        watch = columns[column].get("watch_pids") or {}

        async def measure(watch: dict[str, int] = watch, column: int = column) -> None:
            await asyncio.sleep(window_start - time.perf_counter())
            before = {name: cpu_seconds(pid) for name, pid in watch.items()}
            generator = time.process_time()
            await asyncio.sleep(until - time.perf_counter())
            used = time.process_time() - generator
            cpu_s[column]["generator"] = cpu_s[column].get("generator", 0.0) + used
            for name, pid in watch.items():
                b, a = before[name], cpu_seconds(pid)
                if b is not None and a is not None:
                    cpu_s[column][name] = cpu_s[column].get(name, 0.0) + a - b

        meter = asyncio.create_task(measure())
        completed = await drive(column, until, (window_start, until))
        await meter
        if failures:
            break
        done[column] += completed
        measured[column] += seconds
        per_slice[column].append(round(completed / seconds, 1))
    for group in conns:
        for conn in group:
            conn.close()
    return {
        "columns": [
            {
                "requests": done[i],
                "rps": round(done[i] / measured[i], 1) if measured[i] else 0.0,
                "cpu_us_per_request": {k: round(v * 1e6 / done[i], 1) for k, v in cpu_s[i].items()} if done[i] else {},
                "slices_rps": per_slice[i],
            }
            for i in range(len(columns))
        ],
        "errors": _errors(failures),
    }


async def rate(job: dict[str, Any]) -> dict[str, Any]:
    """Open loop: request i is written at t0 + i/rate whatever the previous ones are doing."""
    request = request_bytes(job)
    loop = asyncio.get_running_loop()
    idle: list[Http1Connection] = await open_many(job["host"], job["port"], job.get("pool", 16))
    opened_extra = 0
    interval = 1.0 / job["rate"]
    warmup_n = int(job["warmup_s"] * job["rate"])
    total_n = warmup_n + int(job["duration_s"] * job["rate"])
    answers: list[Answer] = []
    pending: set[asyncio.Task[None]] = set()
    cpu: list[CpuWindow] = []

    async def one(index: int) -> None:
        nonlocal opened_extra
        conn = idle.pop() if idle else None
        if conn is None:
            opened_extra += 1
            conn = await Http1Connection.open(job["host"], job["port"])
        answer = await conn.send(request)
        if index >= warmup_n:
            answers.append(answer)
        if not conn.closed:
            idle.append(conn)

    t0 = time.perf_counter() + 0.05
    lateness: list[float] = []
    for i in range(total_n):
        due = t0 + i * interval
        delay = due - time.perf_counter()
        if delay > 0:  # never spun: a busy loop would delay reading answers, inflating them
            await asyncio.sleep(delay)
        lateness.append(time.perf_counter() - due)
        if i == warmup_n:
            cpu.append(CpuWindow(job.get("watch_pids") or {}))
        task = loop.create_task(one(i))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.wait(pending, timeout=30)
    usage = cpu[0].result() if cpu else {}
    for conn in idle:
        conn.close()
    ok = [a for a in answers if a.ok]
    return {
        "requests": len(ok),
        "rate": job["rate"],
        "latency_ms": summarize_ms([a.total_s for a in ok]),
        "ttfb_ms": summarize_ms([a.ttfb_s for a in ok]),
        "raw_latency_s": [round(a.total_s, 7) for a in ok],
        "raw_ttfb_s": [round(a.ttfb_s, 7) for a in ok],
        "errors": _errors(answers),
        "send_lateness_ms": summarize_ms(lateness),
        "extra_connections": opened_extra,
        "cpu": usage,
    }


async def streams(job: dict[str, Any]) -> dict[str, Any]:
    request = request_bytes(job)
    conns = await open_many(job["host"], job["port"], job["count"])
    cpu = CpuWindow(job.get("watch_pids") or {})
    answers = await asyncio.gather(*(c.send(request) for c in conns))
    usage = cpu.result()
    for conn in conns:
        conn.close()
    ok = [a for a in answers if a.ok]
    return {
        "streams": len(ok),
        "ttfb_ms": summarize_ms([a.ttfb_s for a in ok]),
        "total_ms": summarize_ms([a.total_s for a in ok]),
        "body_bytes_p50": sorted(a.body_bytes for a in ok)[len(ok) // 2] if ok else 0,
        "errors": _errors(list(answers)),
        "cpu": usage,
    }


async def hold(job: dict[str, Any]) -> dict[str, Any]:
    request = request_bytes(job)
    conns = await open_many(job["host"], job["port"], job["count"])
    answers = [c.send(request) for c in conns]
    deadline = time.perf_counter() + job.get("timeout_s", 30)
    while time.perf_counter() < deadline:
        started = sum(1 for c in conns if c.streaming)
        ended = sum(1 for f in answers if f.done())
        if started + ended >= len(conns):
            break
        await asyncio.sleep(0.02)
    started = sum(1 for c in conns if c.streaming)
    ended_early = [f.result() for f in answers if f.done()]
    print(json.dumps({"held": started, "ended_early": len(ended_early), "errors": _errors(ended_early)}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    for conn in conns:
        conn.close()
    return {"held": started, "ended_early": len(ended_early), "errors": _errors(ended_early)}


async def mint_revoke(job: dict[str, Any]) -> dict[str, Any]:
    """Sequential mint + revoke against the control API; each phase timed on its own."""
    host, port = job["host"], job["port"]
    auth = {"Authorization": f"Bearer {job['token']}", "Content-Type": "application/json"}
    body = json.dumps(job["mint_body"]).encode()
    mint_req = build_request("POST", "/control/v1/keys", f"{host}:{port}", auth, body)
    conn = await Http1Connection.open(host, port)
    mints: list[float] = []
    revokes: list[float] = []
    both: list[float] = []
    failures: list[Answer] = []
    for i in range(job["warmup"] + job["iterations"]):
        minted = await conn.send(mint_req, keep_body=True)
        if minted.status != 201:
            failures.append(minted)
            continue
        key_id = json.loads(minted.body)["key_id"]
        revoke_req = build_request("DELETE", f"/control/v1/keys/{key_id}", f"{host}:{port}", auth)
        revoked = await conn.send(revoke_req)
        if not revoked.ok:
            failures.append(revoked)
            continue
        if i >= job["warmup"]:
            mints.append(minted.total_s)
            revokes.append(revoked.total_s)
            both.append(revoked.done_at - minted.sent_at)
    conn.close()
    return {
        "iterations": len(both),
        "mint_ms": summarize_ms(mints),
        "revoke_ms": summarize_ms(revokes),
        "mint_revoke_ms": summarize_ms(both),
        "errors": _errors(failures),
    }


SCENARIOS = {
    "saturate": saturate,
    "slices": slices,
    "rate": rate,
    "streams": streams,
    "hold": hold,
    "mint_revoke": mint_revoke,
}


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Run one job in this process (uvloop when available); the runner calls it via main()."""
    if job.get("cpus"):
        os.sched_setaffinity(0, set(job["cpus"]))
    scenario = SCENARIOS[job["kind"]]
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency of the daemons
        return asyncio.run(scenario(job))
    return uvloop.run(scenario(job))


def main() -> int:
    job = json.loads(sys.stdin.readline())
    result = run_job(job)
    print(json.dumps({"result": result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
