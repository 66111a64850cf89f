"""`make bench`: direct-to-stub vs a minimal aiohttp proxy vs Leasehold, measured in one run.

Everything runs on loopback and is started and stopped here: the stub upstream, the minimal
proxy (`bench/minimal_proxy.py`), the control daemon and the data plane (and, with `--peers`,
LiteLLM's proxy from its own venv under `bench/.peers/`). The load generator is a separate
process per job (`bench/loadgen.py`). Results: a table on stdout, `bench/results/latest.json`
and a timestamped copy. See bench/README.md for the method and the latest figures.

Presets: default (~2 minutes), `--quick` (~30 s smoke), `smoke` (seconds; the unit test's).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import uvloop

from bench import control_ops, hostile, phases, rpc_rate, websocket
from bench.phases import Context, Plan
from bench.procs import Layout, Servers, pin_self
from bench.report import aims, derive, generator_check, render

RESULTS_DIR = Path(__file__).resolve().parent / "results"
# Other processes using more than this many cores make the figures unreliable (noted in the table).
QUIET_CORES = 0.25

PLANS = {
    "default": Plan(),
    "quick": Plan(
        rounds=1,
        saturate_warmup_s=0.5,
        saturate_s=1.5,
        rate_warmup_s=0.5,
        rate_s=3.0,
        stream_rate_s=2.0,
        streams=100,
        held_streams=300,
        mint_warmup=5,
        mint_iterations=50,
        start_trials=1,
        rpc_s=0.3,
        rpc_sequential=100,
        ws_turns=2,
        ws_events=100,
        ws_burst=2000,
        ws_sockets=100,
    ),
    "smoke": Plan(
        body_bytes=512,
        rounds=1,
        warm_requests=2,
        saturate_connections=2,
        saturate_warmup_s=0.1,
        saturate_s=0.2,
        rate=50,
        rate_warmup_s=0.05,
        rate_s=0.2,
        stream_rate=20,
        stream_rate_s=0.2,
        streams=3,
        stream_chunks=8,
        stream_gap_s=0.0,
        held_streams=3,
        hold_stall_s=30.0,
        mint_warmup=1,
        mint_iterations=3,
        start_trials=1,
        rpc_s=0.05,
        rpc_sequential=5,
        hostile_s=0.0,
        ws_turns=1,
        ws_events=10,
        ws_burst=50,
        ws_sockets=3,
    ),
}


def versions() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
        "msgspec": msgspec.__version__,
        "uvloop": uvloop.__version__,
    }


def machine() -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "usable_cpus": sorted(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
    }


class Noise:
    """How much CPU the rest of the machine used while we ran (other test runs skew figures)."""

    def __init__(self) -> None:
        self.busy0, self.total0 = _cpu_jiffies()
        self.ours0 = _our_cpu_s()
        self.t0 = time.monotonic()
        self.load0 = _loadavg()

    def result(self) -> dict[str, Any]:
        busy1, total1 = _cpu_jiffies()
        wall = time.monotonic() - self.t0
        cores = os.cpu_count() or 1
        tck = os.sysconf("SC_CLK_TCK")
        machine_busy_s = (busy1 - self.busy0) / tck
        ours_s = _our_cpu_s() - self.ours0
        foreign = max(0.0, machine_busy_s - ours_s) / max(wall, 1e-9)
        return {
            "cores": cores,
            "wall_s": round(wall, 1),
            "foreign_cpu_share": round(foreign, 2),
            "loadavg_start": self.load0,
            "loadavg_end": _loadavg(),
        }


def busy_cores(seconds: float = 1.0) -> float:
    """How many cores the whole machine kept busy over the next `seconds` (we are idle)."""
    busy0, _ = _cpu_jiffies()
    time.sleep(seconds)
    busy1, _ = _cpu_jiffies()
    return round((busy1 - busy0) / os.sysconf("SC_CLK_TCK") / seconds, 2)


def wait_quiet(limit_s: float, say, threshold: float = QUIET_CORES) -> float:
    """Wait (up to `limit_s`) until other processes use less than `threshold` cores."""
    deadline = time.monotonic() + limit_s
    busy = busy_cores()
    while busy >= threshold and time.monotonic() < deadline:
        say(f"machine busy ({busy} cores used by other processes); waiting for it to quieten ...")
        busy = busy_cores(2.0)
    return busy


def _cpu_jiffies() -> tuple[int, int]:
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def _our_cpu_s() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _loadavg() -> str:
    with open("/proc/loadavg") as fh:
        return " ".join(fh.read().split()[:3])


def measure(
    plan: Plan,
    workdir: Path,
    pin: bool,
    peers: bool,
    peers_spec: str | None,
    say=print,
    quiet_wait_s: float = 0.0,
    gateway_env: dict[str, str] | None = None,
    trees: tuple[Path, ...] = (),
) -> dict[str, Any]:
    """Run every phase and return the results dict (the JSON file's content)."""
    all_cpus = os.sched_getaffinity(0)
    layout = Layout.decide(all_cpus, pin)
    preflight = wait_quiet(quiet_wait_s, say) if quiet_wait_s > 0 else None
    noise = Noise()
    results: dict[str, Any] = {
        "schema": 1,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "versions": versions(),
        "layout": layout.describe(),
        "layout_cpus": msgspec.to_builtins(layout),
        "plan": msgspec.to_builtins(plan),
    }
    pin_self(layout.server_cpus)  # the servers started below inherit it
    try:
        _measure_pinned(results, plan, layout, workdir, all_cpus, peers, peers_spec, say, gateway_env, trees)
    finally:
        os.sched_setaffinity(0, all_cpus)
    results["noise"] = {**noise.result(), "busy_cores_before": preflight, "quiet_threshold": QUIET_CORES}
    results["derived"] = derive(results)
    results["aims"] = [msgspec.to_builtins(v) for v in aims(results, results["derived"])]
    results["generator_check"] = generator_check(results)
    return results


def _measure_pinned(
    results: dict[str, Any],
    plan: Plan,
    layout: Layout,
    workdir: Path,
    all_cpus: set[int],
    peers: bool,
    peers_spec: str | None,
    say,
    gateway_env: dict[str, str] | None,
    trees: tuple[Path, ...],
) -> None:
    say("rpc: messages per second over a Unix socket ...")
    results["rpc"] = rpc_rate.run(plan.rpc_s, sequential=plan.rpc_sequential)
    say("starting stub, minimal proxy, Leasehold ...")
    results["leasehold_env"] = {
        k: ("<redacted>" if "TOKEN" in k or "KEY" in k else v) for k, v in (gateway_env or {}).items()
    }
    results["compare_trees"] = [str(t) for t in trees]
    servers = Servers(workdir, gateway_env, trees)
    try:
        targets = servers.targets("/v1/messages", phases.ANTHROPIC_HEADERS)
        if peers:
            from bench import peers as peer_mod  # imported on demand: it may install things

            results["peers"], litellm = peer_mod.litellm_target(workdir, servers, peers_spec, say)
            if litellm is not None:
                targets.append(litellm)
        results["targets"] = [t.name for t in targets]
        ctx = Context(plan=plan, layout=layout, servers=servers, targets=targets)
        say("start to ready ...")
        results["start"] = control_ops.start_to_ready(servers.stub, workdir / "start", plan.start_trials, all_cpus)
        say("warming up ...")
        phases.warm(ctx)
        for key, label, run in (
            ("held", f"{plan.held_streams} open streams (RSS)", phases.held_streams),
            ("saturation", "saturation throughput", phases.saturation),
            ("fixed_rate", f"latency at {plan.rate} req/s", phases.fixed_rate),
            ("stream_rate", f"stream TTFB at {plan.stream_rate} streams/s", phases.stream_rate),
            ("streams", f"{plan.streams} concurrent streams", phases.concurrent_streams),
        ):
            say(f"{label} ...")
            results[key] = run(ctx)
        say("mint + revoke ...")
        results["mint_revoke"] = control_ops.mint_revoke(
            servers.gateway, layout, plan.mint_warmup, plan.mint_iterations
        )
        if plan.hostile_s > 0:  # issue 21: bombs, idle connections, the cap, a stalled reader
            results["hostile"] = hostile.measure(servers.stub, workdir / "hostile", seconds=plan.hostile_s, say=say)
    finally:
        servers.close()
    say("websocket: direct vs a naive relay vs Leasehold ...")
    results["websocket"] = websocket.run(
        workdir / "ws",
        websocket.WsPlan(turns=plan.ws_turns, events=plan.ws_events, burst=plan.ws_burst, sockets=plan.ws_sockets),
        say,
    )


def write(results: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = results["started_at"].replace(":", "").replace("-", "")
    text = json.dumps(results, indent=2, sort_keys=False) + "\n"
    (out_dir / f"run-{stamp}.json").write_text(text)
    latest = out_dir / "latest.json"
    latest.write_text(text)
    return latest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a ~30 s smoke run with smaller figures")
    parser.add_argument("--preset", choices=sorted(PLANS), default=None, help="explicit preset")
    parser.add_argument("--peers", action="store_true", help="add LiteLLM's proxy as a column")
    parser.add_argument("--peers-spec", default=None, help="pip requirement for LiteLLM (pinned default)")
    parser.add_argument("--no-pin", action="store_true", help="do not pin generator and servers to cores")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="results directory")
    parser.add_argument("--keep-workdir", action="store_true", help="keep daemon logs and state")
    parser.add_argument(
        "--leasehold-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra GATEWAY_* setting for the Leasehold columns (repeatable)",
    )
    parser.add_argument(
        "--compare-tree",
        action="append",
        default=[],
        type=Path,
        metavar="PATH",
        help="add a column running Leasehold's daemons from another checkout",
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="first wait up to SECONDS for other processes to leave the CPUs idle",
    )
    args = parser.parse_args(argv)
    plan = PLANS[args.preset or ("quick" if args.quick else "default")]
    workdir = Path(tempfile.mkdtemp(prefix="leasehold-bench-"))
    try:
        results = measure(
            plan,
            workdir,
            not args.no_pin,
            args.peers,
            args.peers_spec,
            say=lambda m: print(f"bench: {m}", file=sys.stderr, flush=True),
            quiet_wait_s=args.wait_quiet,
            gateway_env=dict(item.split("=", 1) for item in args.leasehold_env),
            trees=tuple(args.compare_tree),
        )
    finally:
        if args.keep_workdir:
            print(f"bench: logs and state kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    latest = write(results, args.out)
    print(render(results))
    print(f"\nresults: {latest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
