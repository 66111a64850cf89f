"""Control-side figures: start to ready, and mint + revoke round trips (through the generator).

Start to ready spawns control and the data plane together, as systemd does for two
`Type=simple` units, unpinned (a daemon start is not a load test), and stops the clock when
control reports the data plane synchronised and the data plane accepts connections.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from bench.procs import MINT_BODY, Layout, run_loadgen
from bench.stats import summarize_ms
from tests.support.harness import Gateway, Proc, Stub, wait_until


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def start_to_ready(stub: Stub, workdir: Path, trials: int, cpus: set[int]) -> dict[str, Any]:
    """Median-friendly samples of a cold start of both daemons on `cpus` (every core)."""
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    control_s: list[float] = []
    ready_s: list[float] = []
    try:
        for trial in range(trials):
            gw = Gateway(workdir / f"start-{trial}", stub)
            t0 = time.perf_counter()
            gw.control = Proc([sys.executable, "-m", "controlplane.main"], gw.env, gw.workdir / "control.log")
            gw.dataplane = Proc([sys.executable, "-m", "dataplane.main"], gw.env, gw.workdir / "dataplane.log")
            try:
                wait_until(lambda: gw.healthz() is not None, 30, "control healthz", interval_s=0.002)
                control_s.append(time.perf_counter() - t0)
                wait_until(
                    lambda: (gw.healthz() or {}).get("dataplane_connected") and _accepts(gw.dataplane_port),
                    30,
                    "data plane ready",
                    interval_s=0.002,
                )
                ready_s.append(time.perf_counter() - t0)
            finally:
                gw.stop()
    finally:
        os.sched_setaffinity(0, previous)
    return {"trials": trials, "control_ready_ms": summarize_ms(control_s), "gateway_ready_ms": summarize_ms(ready_s)}


def mint_revoke(gateway: Gateway, layout: Layout, warmup: int, iterations: int) -> dict[str, Any]:
    job = {
        "kind": "mint_revoke",
        "host": "127.0.0.1",
        "port": gateway.control_port,
        "token": gateway.control_token,
        "mint_body": MINT_BODY,
        "warmup": warmup,
        "iterations": iterations,
        "cpus": list(layout.generator_cpus or ()),
    }
    return run_loadgen(job)


def leasehold_settled(gateway: Gateway, timeout_s: float = 20) -> bool:
    """After a phase: control's in-flight registry back to zero (no phantom route)."""
    try:
        wait_until(lambda: gateway.active().get("count") == 0, timeout_s, "no route in flight")
    except AssertionError:
        return False
    return True
