"""Start to ready and idle RSS, this checkout against others: `python -m bench.startup [-n 5] [TREE ...]`.

Both daemons are spawned at once (as systemd starts two `Type=simple` units, like
`bench.control_ops.start_to_ready`), the clock stops when control reports the data plane
synchronised and the data plane accepts connections (and how long after control's own HTTP
answered: the data plane's dialling), and each daemon's CPU time so far is read
(less at the mercy of a busy machine than the wall clock); then, after `--settle` seconds of
idling, each daemon's `VmRSS` is read. Trials alternate between the checkouts (A B A B ...), so drift
on a shared machine hits each alike; every trial is printed, then medians. A `TREE`'s daemons run
with its own `.venv` when it has one (`bench.procs.module_argv`); `make bench-ab`'s baseline tree
is one such. With no `TREE`, `--baseline` builds bench/BASELINE's commit as `make bench-ab` does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.control_ops import _accepts
from bench.procs import module_argv, rss_kib, start_stub
from tests.support.harness import Gateway, Proc, Stub, wait_until


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far (/proc/PID/stat), 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_start(stub: Stub, workdir: Path, tree: Path | None, settle_s: float) -> dict[str, float]:
    """One cold start of both daemons from `tree` (None: this checkout): seconds and MiB."""
    gw = Gateway(workdir, stub)
    t0 = time.perf_counter()
    gw.control = Proc(module_argv("controlplane.main", tree), gw.env, workdir / "control.log")
    gw.dataplane = Proc(module_argv("dataplane.main", tree), gw.env, workdir / "dataplane.log")
    try:
        wait_until(lambda: gw.healthz() is not None, 30, "control healthz", interval_s=0.002)
        control_s = time.perf_counter() - t0
        wait_until(
            lambda: (gw.healthz() or {}).get("dataplane_connected") and _accepts(gw.dataplane_port),
            30,
            "data plane ready",
            interval_s=0.002,
        )
        ready_s = time.perf_counter() - t0
        cpu = {"control_cpu_s": cpu_s(gw.control.popen.pid), "dataplane_cpu_s": cpu_s(gw.dataplane.popen.pid)}
        time.sleep(settle_s)  # a measurement's idle window, not synchronisation
        control = rss_kib(gw.control.popen.pid) or 0
        dataplane = rss_kib(gw.dataplane.popen.pid) or 0
    finally:
        gw.stop()
    return {
        "ready_s": ready_s,
        "link_s": ready_s - control_s,
        **cpu,
        "control_mib": control / 1024,
        "dataplane_mib": dataplane / 1024,
        "both_mib": (control + dataplane) / 1024,
    }


def run(trees: list[Path | None], trials: int, settle_s: float) -> dict[str, list[dict[str, float]]]:
    results: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="leasehold-startup-") as tmp:
        stub = start_stub(Path(tmp) / "stub")
        try:
            for trial in range(trials):
                for index, tree in enumerate(trees):
                    name = "current" if tree is None else f"@{tree.name}"
                    sample = one_start(stub, Path(tmp) / f"{trial}-{index}", tree, settle_s)
                    results.setdefault(name, []).append(sample)
                    print(
                        f"  trial {trial} {name:24s} ready {sample['ready_s'] * 1000:6.0f} ms "
                        f"({sample['link_s'] * 1000:4.0f} after control's; CPU "
                        f"control {sample['control_cpu_s'] * 1000:4.0f}, data plane "
                        f"{sample['dataplane_cpu_s'] * 1000:4.0f} ms)  "
                        f"idle RSS control {sample['control_mib']:5.1f} + data plane "
                        f"{sample['dataplane_mib']:5.1f} = {sample['both_mib']:5.1f} MiB",
                        flush=True,
                    )
        finally:
            stub.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", type=Path)
    parser.add_argument("-n", "--trials", type=int, default=5)
    parser.add_argument("--settle", type=float, default=1.0, help="idle seconds before reading RSS")
    parser.add_argument("--baseline", action="store_true", help="add bench/BASELINE's commit, built")
    args = parser.parse_args(argv)
    trees: list[Path | None] = [None, *(t.resolve() for t in args.trees)]
    if not args.baseline:
        return report(run(trees, args.trials, args.settle))
    from bench import baseline

    with tempfile.TemporaryDirectory(prefix="leasehold-baseline-") as tmp:
        tree = Path(tmp) / f"baseline-{baseline.baseline_commit()}"
        try:
            baseline.build(baseline.baseline_commit(), tree)
            return report(run([*trees, tree], args.trials, args.settle))
        finally:
            baseline.remove(tree)


def report(results: dict[str, list[dict[str, float]]]) -> int:
    print("medians (min–max):")
    for name, samples in results.items():

        def fig(key: str, scale: float = 1.0) -> str:
            values = [s[key] * scale for s in samples]
            return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"

        print(
            f"  {name:24s} ready {fig('ready_s', 1000)} ms ({fig('link_s', 1000)} after control's), "
            f"CPU to ready control {fig('control_cpu_s', 1000)}, data plane {fig('dataplane_cpu_s', 1000)} ms; "
            f"idle RSS control {fig('control_mib')}, "
            f"data plane {fig('dataplane_mib')}, both {fig('both_mib')} MiB"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
