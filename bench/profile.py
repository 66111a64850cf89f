"""Where the data plane's time goes under load: py-spy on the live daemons, folded by function.

Usage: ``python -m bench.profile [--seconds 10] [--stream]`` (needs ``pip install py-spy``).
It starts the same servers as `make bench`, drives Leasehold at saturation (non-streaming, or
concurrent SSE streams with ``--stream``) from the generator process, samples the data plane
and the control daemon with py-spy, and prints each one's busiest functions: *self* share (time
in the function's own code) and *inclusive* share (time with the function on the stack), both
as a share of the samples in which the process was busy.

`fold` and `top` are pure (collapsed stacks in, shares out) and tested.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from bench import phases
from bench.phases import Context
from bench.procs import Layout, Servers, pin_self, run_loadgen
from bench.run import PLANS


def _py_spy() -> str | None:
    """py-spy beside this interpreter (the venv's, even when it is not on PATH), else on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def fold(collapsed: str) -> tuple[Counter[str], Counter[str], int]:
    """(self counts, inclusive counts, total samples) from py-spy's `--format raw` output."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_short(f) for f in stack.split(";")]
        frames = [f for f in frames if not f.startswith("process ") and not f.startswith("thread ")]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    return own, inclusive, total


def _short(frame: str) -> str:
    """`func (path/to/pkg/module.py:123)` → `func (pkg/module.py)`: one entry per function."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(path).parts
    return f"{name} ({'/'.join(parts[-2:])})" if parts else name


def top(counts: Counter[str], total: int, limit: int) -> list[tuple[str, float]]:
    return [(frame, round(100.0 * n / total, 1)) for frame, n in counts.most_common(limit)] if total else []


def record(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            _py_spy() or "py-spy",
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(int(seconds)),
            "--rate",
            "250",
            "--format",
            "raw",
            "--output",
            str(out),
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--stream", action="store_true", help="profile concurrent SSE streams instead")
    parser.add_argument("--limit", type=int, default=25)
    args = parser.parse_args(argv)
    if _py_spy() is None:
        print("bench.profile: py-spy is not installed (pip install py-spy)", file=sys.stderr)
        return 2
    all_cpus = os.sched_getaffinity(0)
    layout = Layout.decide(all_cpus, True)
    pin_self(layout.server_cpus)
    workdir = Path(tempfile.mkdtemp(prefix="leasehold-profile-"))
    servers = Servers(workdir)
    try:
        plan = PLANS["default"]
        targets = [t for t in servers.targets("/v1/messages", phases.ANTHROPIC_HEADERS) if t.name == "leasehold"]
        ctx = Context(plan=plan, layout=layout, servers=servers, targets=targets)
        phases.warm(ctx)
        gw = servers.gateway
        assert gw.dataplane is not None and gw.control is not None
        pids = {"dataplane": gw.dataplane.popen.pid, "control": gw.control.popen.pid}
        outs = {name: workdir / f"{name}.txt" for name in pids}
        spies = {name: record(pid, args.seconds, outs[name]) for name, pid in pids.items()}
        target = targets[0]
        if args.stream:
            step = phases.stream_step(plan)
            rounds = max(1, int(args.seconds / (plan.stream_chunks * plan.stream_gap_s + 0.5)))
            for _ in range(rounds):
                run_loadgen(phases._job(ctx, target, "streams", stream=True, step=step, count=plan.streams))
        else:
            run_loadgen(
                phases._job(
                    ctx,
                    target,
                    "saturate",
                    stream=False,
                    step=None,
                    connections=plan.saturate_connections,
                    warmup_s=0.2,
                    duration_s=args.seconds,
                )
            )
        for name, spy in spies.items():
            _, err = spy.communicate(timeout=args.seconds + 60)
            if spy.returncode != 0 or not outs[name].exists():
                print(f"{name}: py-spy failed: {err.decode(errors='replace')[-500:]}")
                continue
            own, inclusive, total = fold(outs[name].read_text())
            print(f"\n== {name}: {total} busy samples ==")
            print("  self %   function")
            for frame, share in top(own, total, args.limit):
                print(f"  {share:6.1f}   {frame}")
            print("  incl %   function")
            for frame, share in top(inclusive, total, args.limit):
                print(f"  {share:6.1f}   {frame}")
    finally:
        servers.close()
        os.sched_setaffinity(0, all_cpus)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
