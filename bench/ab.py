"""Saturation only, A/B: `python -m bench.ab [--rounds 4] [--alone] [TREE ...]`.

The quick way to decide a performance change: the minimal proxy, Leasehold from this checkout
and Leasehold from each other checkout given (`TREE`, as `bench.run --compare-tree` takes it)
are driven at saturation in interleaved rounds against one stub, and each column's mean req/s
and CPU µs per request per process are printed, then Leasehold's ratio to every other column
round by round, with the median and range. A round is sliced: one generator process holds 64
connections open to every column, and the columns take turns at saturation in `--slice`-second
slices, mirrored (A B C C B A, repeated until each column has had its `--seconds`; odd rounds
start from the other end). A column's throughput is the answers completed inside its slices'
measured windows (after `--settle`), so a drift of the machine is sampled every few hundred ms
for every column alike instead of once per window, and no column pays for a process start or a
connection handshake. `--windows` keeps the older grain: one generator process per window, each
column running half its `--seconds`, then the other half in reverse (`--flat`: one window per
column, A B C). Same servers, request and generator as `make bench`'s saturation phase
(`bench.phases`).

`--rate N` adds a fixed-rate phase after the saturation rounds (issue 27: "the added p50 at
50 req/s"): every column, direct-to-stub included, is driven open-loop at N req/s for
`--rate-seconds` per round, interleaved the same way, and each column's p50 / p99 is printed with
Leasehold's p50 minus every other column's p50 round by round (ms; ≤ +0.1 over the minimal proxy
is the aim).

`--alone` changes the layout: the proxy under test (the minimal proxy, or Leasehold's data
plane) gets CPU 1 to itself and everything else — generator, stub, control — shares CPU 0. It
answers "what does the proxy itself cost per request", without the cache and scheduling effects
of sharing a core with the stub and control that `make bench`'s layout includes on purpose.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path
from typing import TypeVar

from bench.phases import Context, _job
from bench.procs import Layout, Servers, Target, pin_self, run_loadgen
from bench.run import PLANS

HEADERS = {"content-type": "application/json", "anthropic-version": "2023-06-01"}


def _proxy_pid(target: Target) -> int:
    return target.pids.get("dataplane") or target.pids["minimal-proxy"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", type=Path, help="other checkouts to add as columns")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=2.5, help="measured window per round")
    parser.add_argument("--alone", action="store_true", help="give the proxy under test a core of its own")
    parser.add_argument("--rate", type=int, default=0, help="then a fixed-rate latency phase at this req/s")
    parser.add_argument("--rate-seconds", type=float, default=5.0, help="measured window per fixed-rate round")
    parser.add_argument("--no-saturation", action="store_true", help="only the fixed-rate phase")
    parser.add_argument(
        "--windows",
        action="store_true",
        help="one generator process per window, two windows per column per round (A B C C B A), not slices",
    )
    parser.add_argument(
        "--flat", action="store_true", help="with --windows: one window per column per round (A B C), not mirrored"
    )
    parser.add_argument("--slice", type=float, default=0.5, help="seconds per slice (default layout: slices)")
    parser.add_argument("--settle", type=float, default=0.1, help="unmeasured start of each slice")
    args = parser.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        parser.error("needs two CPUs (generator and servers are pinned apart)")
    layout = Layout(generator_cpus=(cpus[0],), server_cpus=(cpus[1],))
    results: dict[str, list[tuple[float, dict[str, float]]]] = {}
    latency: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as workdir:
        pin_self((cpus[0],) if args.alone else layout.server_cpus)  # the servers inherit it
        try:
            servers = Servers(Path(workdir), trees=tuple(args.trees))
        finally:
            os.sched_setaffinity(0, set(cpus))
        try:
            every = servers.targets("/v1/messages", HEADERS)
            targets = every[1:]  # not direct-to-stub
            if args.alone:
                for target in targets:
                    os.sched_setaffinity(_proxy_pid(target), {cpus[1]})
            ctx = Context(plan=PLANS["default"], layout=layout, servers=servers, targets=targets)
            if not args.no_saturation:
                if args.windows or args.flat:
                    ran = _saturation(ctx, args.rounds, args.seconds, results, not args.flat)
                else:
                    ran = _sliced(ctx, args.rounds, args.seconds, args.slice, args.settle, results)
                if not ran:
                    return 1
            if args.rate > 0:
                _fixed_rate(ctx, every, args.rounds, args.rate, args.rate_seconds, latency)
        finally:
            servers.close()
    if results:
        grain = (
            "windows" if args.windows or args.flat else f"slices of {args.slice} s, {args.settle} s of each unmeasured"
        )
        _print_saturation(results, args.rounds, args.seconds, args.alone, grain)
    if latency:
        _print_latency(latency, args.rounds, args.rate, args.rate_seconds)
    return 0


def _interleaved(targets: list[Target], index: int) -> list[Target]:
    """Odd rounds run the columns in reverse, so no column always follows the same one."""
    return targets if index % 2 == 0 else targets[::-1]


T = TypeVar("T")


def mirrored(columns: list[T], index: int) -> list[T]:
    """One round's windows: the columns in the round's order, then back (A B C C B A).

    Each column's two windows sit symmetrically about the round's middle, so a drift of the
    machine that is linear over the round adds the same to every column's mean and cancels in
    its ratios; a burst that hits one window counts half.
    """
    order = columns if index % 2 == 0 else columns[::-1]
    return order + order[::-1]


def combine(runs: list[tuple[float, dict[str, float]]]) -> tuple[float, dict[str, float]]:
    """A column's windows of one round (equal lengths) as one: mean req/s, mean CPU µs per request."""
    rps = statistics.mean(r for r, _ in runs)
    names = {name for _, cpu in runs for name in cpu}
    cpu = {name: statistics.mean(c[name] for _, c in runs if name in c) for name in sorted(names)}
    return rps, cpu


def _saturation(
    ctx: Context,
    rounds: int,
    seconds: float,
    results: dict[str, list[tuple[float, dict[str, float]]]],
    mirror: bool = True,
) -> bool:
    for index in range(rounds):
        windows: dict[str, list[tuple[float, dict[str, float]]]] = {}
        order = mirrored(ctx.targets, index) if mirror else _interleaved(ctx.targets, index)
        for target in order:
            run = run_loadgen(
                _job(
                    ctx,
                    target,
                    "saturate",
                    stream=False,
                    step=None,
                    connections=64,
                    warmup_s=0.5,
                    duration_s=seconds / 2 if mirror else seconds,
                )
            )
            if run["errors"] or not run["rps"]:
                print(f"{target.name}: errors {run['errors']}")
                return False
            cpu = {name: share * 1e6 / run["rps"] for name, share in run["cpu"].items() if share is not None}
            windows.setdefault(target.name, []).append((run["rps"], cpu))
        for name, runs in windows.items():
            results.setdefault(name, []).append(combine(runs))
    return True


def slice_order(columns: int, index: int, per_column: int) -> list[int]:
    """One round's slices: `mirrored` repeated (A B C C B A A B C C B A ...) until every column
    has `per_column` slices (rounded up to an even count), odd rounds starting from the other end."""
    pairs = max(1, -(-per_column // 2))
    return mirrored(list(range(columns)), index) * pairs


def _sliced(
    ctx: Context,
    rounds: int,
    seconds: float,
    slice_s: float,
    settle_s: float,
    results: dict[str, list[tuple[float, dict[str, float]]]],
) -> bool:
    """Each round one generator process drives every column in turn, `slice_s` at a time
    (`bench.loadgen`'s `slices`): `seconds` of measured time per column per round."""
    per_column = max(1, round(seconds / (slice_s - settle_s)))
    for index in range(rounds):
        base = _job(ctx, ctx.targets[0], "slices", stream=False, step=None)
        job = {
            **base,
            "columns": [
                {"host": t.host, "port": t.port, "path": t.path, "headers": dict(t.headers), "watch_pids": t.pids}
                for t in ctx.targets
            ],
            "order": slice_order(len(ctx.targets), index, per_column),
            "connections": 64,
            "warmup_s": 0.5,
            "slice_s": slice_s,
            "settle_s": settle_s,
        }
        run = run_loadgen(job, timeout_s=300 + len(job["order"]) * slice_s * 2)
        if run["errors"]:
            print(f"errors {run['errors']}")
            return False
        for target, column in zip(ctx.targets, run["columns"], strict=True):
            if not column["rps"]:
                print(f"{target.name}: no request completed")
                return False
            results.setdefault(target.name, []).append((column["rps"], column["cpu_us_per_request"]))
    return True


def _fixed_rate(
    ctx: Context,
    targets: list[Target],
    rounds: int,
    rate: int,
    seconds: float,
    latency: dict[str, list[dict[str, float]]],
) -> None:
    """Open loop at `rate` req/s, every column (direct included) in interleaved rounds."""
    for index in range(rounds):
        for target in _interleaved(targets, index):
            run = run_loadgen(
                _job(ctx, target, "rate", stream=False, step=None, rate=rate, warmup_s=0.5, duration_s=seconds)
            )
            summary = dict(run["latency_ms"])
            summary["errors"] = float(sum(run["errors"].values()))
            latency.setdefault(target.name, []).append(summary)


def _print_saturation(
    results: dict[str, list[tuple[float, dict[str, float]]]], rounds: int, seconds: float, alone: bool, layout: str
) -> None:
    print(
        f"saturation, {rounds} interleaved rounds of {seconds} s per column ({layout}), "
        f"{'proxy alone on its core' if alone else 'servers sharing one core'}"
    )
    for name, runs in results.items():
        rps = [r for r, _ in runs]
        cpu = {k: statistics.mean(c.get(k, 0.0) for _, c in runs) for k in runs[0][1]}
        print(
            f"  {name:28s} {statistics.mean(rps):7,.0f} req/s (rounds {', '.join(f'{r:,.0f}' for r in rps)})  "
            + "  ".join(f"{k} {v:.0f} µs" for k, v in cpu.items())
        )
    rps_of = {name: [r for r, _ in runs] for name, runs in results.items()}
    for other in [n for n in rps_of if n != "leasehold"]:
        print(ratio_line(f"leasehold / {other}", round_ratios(rps_of["leasehold"], rps_of[other])))


def _print_latency(latency: dict[str, list[dict[str, float]]], rounds: int, rate: int, seconds: float) -> None:
    print(f"latency at {rate} req/s, {rounds} interleaved rounds of {seconds} s (ms)")
    for name, runs in latency.items():
        p50 = [r.get("p50", float("nan")) for r in runs]
        p99 = [r.get("p99", float("nan")) for r in runs]
        errors = sum(r["errors"] for r in runs)
        print(
            f"  {name:28s} p50 {statistics.median(p50):.3f} (rounds {' '.join(f'{x:.3f}' for x in p50)})  "
            f"p99 median {statistics.median(p99):.3f}  errors {errors:.0f}"
        )
    mine = [r.get("p50", float("nan")) for r in latency["leasehold"]]
    for other in [n for n in latency if n != "leasehold"]:
        theirs = [r.get("p50", float("nan")) for r in latency[other]]
        print(diff_line(f"leasehold p50 - {other} p50", [a - b for a, b in zip(mine, theirs, strict=True)]))


def diff_line(label: str, diffs: list[float]) -> str:
    """`label: +median (min–max) ms over N rounds; rounds d1 d2 ...`."""
    return (
        f"  {label:40s} {statistics.median(diffs):+.3f} ms ({min(diffs):+.3f}–{max(diffs):+.3f}) "
        f"over {len(diffs)} rounds; rounds {' '.join(f'{d:+.3f}' for d in diffs)}"
    )


def round_ratios(a: list[float], b: list[float]) -> list[float]:
    """A / B round by round: both ran in the same round, so the machine's drift cancels."""
    return [x / y for x, y in zip(a, b, strict=True)]


def ratio_line(label: str, ratios: list[float]) -> str:
    """`label: median (min–max) over N rounds; rounds r1 r2 ...` — every round, not only the median."""
    return (
        f"  {label:40s} {statistics.median(ratios):.3f}x ({min(ratios):.3f}–{max(ratios):.3f}) "
        f"over {len(ratios)} rounds; rounds {' '.join(f'{r:.3f}' for r in ratios)}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
