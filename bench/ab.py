"""Saturation only, A/B: `python -m bench.ab [--rounds 4] [--alone] [TREE ...]`.

The quick way to decide a performance change: the minimal proxy, Leasehold from this checkout
and Leasehold from each other checkout given (`TREE`, as `bench.run --compare-tree` takes it)
are driven at saturation in interleaved rounds against one stub, and each column's mean req/s
and CPU µs per request per process are printed, then Leasehold's ratio to every other column
round by round (each round's columns ran back to back, so the machine's drift cancels), with the
median and range. Same servers, request and generator as
`make bench`'s saturation phase (`bench.phases`).

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
    args = parser.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        parser.error("needs two CPUs (generator and servers are pinned apart)")
    layout = Layout(generator_cpus=(cpus[0],), server_cpus=(cpus[1],))
    results: dict[str, list[tuple[float, dict[str, float]]]] = {}
    with tempfile.TemporaryDirectory() as workdir:
        pin_self((cpus[0],) if args.alone else layout.server_cpus)  # the servers inherit it
        try:
            servers = Servers(Path(workdir), trees=tuple(args.trees))
        finally:
            os.sched_setaffinity(0, set(cpus))
        try:
            targets = servers.targets("/v1/messages", HEADERS)[1:]  # not direct-to-stub
            if args.alone:
                for target in targets:
                    os.sched_setaffinity(_proxy_pid(target), {cpus[1]})
            ctx = Context(plan=PLANS["default"], layout=layout, servers=servers, targets=targets)
            for index in range(args.rounds):
                # odd rounds run the columns in reverse, so no column always follows the same one
                for target in targets if index % 2 == 0 else targets[::-1]:
                    run = run_loadgen(
                        _job(
                            ctx,
                            target,
                            "saturate",
                            stream=False,
                            step=None,
                            connections=64,
                            warmup_s=0.5,
                            duration_s=args.seconds,
                        )
                    )
                    if run["errors"] or not run["rps"]:
                        print(f"{target.name}: errors {run['errors']}")
                        return 1
                    cpu = {name: share * 1e6 / run["rps"] for name, share in run["cpu"].items() if share is not None}
                    results.setdefault(target.name, []).append((run["rps"], cpu))
        finally:
            servers.close()
    print(
        f"saturation, {args.rounds} interleaved rounds of {args.seconds} s, "
        f"{'proxy alone on its core' if args.alone else 'servers sharing one core'}"
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
    return 0


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
