"""Instructions per request, counted by callgrind: a cost figure a shared machine cannot blur.

Usage: ``python -m bench.instructions [--requests 400] [--connections 8] [--control] [TREE ...]``
(needs valgrind). For this checkout and each other checkout given, it starts the stub and a
gateway whose data plane (and, with ``--control``, whose control daemon) runs under
``valgrind --tool=callgrind`` with collection off; warms it up; switches collection on
(``callgrind_control -i on``), sends `--requests` non-streaming requests over `--connections`
keep-alive connections (the saturation phase's request), switches it off and prints the
instructions the daemon executed per request.

Why: on the two shared cores, throughput and CPU time per request move by ±10 % between rounds
with the neighbours' load; an instruction count does not (a re-run agrees within ~0.5 %), so a
change of a few µs per request is visible in one run. It counts user-space instructions only
(no syscall's kernel time, no cache miss), so it ranks Python-level work well and a change in
the number of writes not at all: the throughput A/B (`make bench-ab`) still decides.
Timers run ~50x slower under valgrind, so a 2 ms batching window batches less than it would.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.http1 import Http1Connection, build_request
from bench.phases import ANTHROPIC_HEADERS, request_body
from bench.procs import mint_token, module_argv, start_stub
from bench.run import PLANS
from tests.support.harness import Gateway, Proc, wait_until

_TOTALS = re.compile(r"^(?:totals|summary):\s*(\d+)", re.M)


def _callgrind(argv: list[str], out: Path) -> list[str]:
    return [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        "--dump-instr=no",
        f"--callgrind-out-file={out}",
        *argv,
    ]


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True, timeout=120)


def _total(out: Path) -> int:
    """Instructions in every dump of `out` (callgrind numbers later dumps `out.N`)."""
    total = 0
    for path in [out, *sorted(out.parent.glob(out.name + ".*"))]:
        if path.exists():
            found = _TOTALS.findall(path.read_text(errors="replace"))
            total += int(found[-1]) if found else 0
    return total


async def _drive(port: int, request: bytes, connections: int, per_connection: int) -> int:
    conns = [await Http1Connection.open("127.0.0.1", port) for _ in range(connections)]
    ok = 0

    async def one(conn: Http1Connection) -> None:
        nonlocal ok
        for _ in range(per_connection):
            answer = await conn.send(request)
            ok += answer.ok

    await asyncio.gather(*(one(c) for c in conns))
    for conn in conns:
        conn.close()
    return ok


def measure(tree: Path | None, workdir: Path, args: argparse.Namespace) -> dict[str, float]:
    stub = start_stub(workdir / "stub")
    gw = Gateway(workdir / "gw", stub)
    outs = {"dataplane": workdir / "dataplane.cg", "control": workdir / "control.cg"}
    try:
        control_argv = module_argv("controlplane.main", tree)
        gw.control = Proc(
            _callgrind(control_argv, outs["control"]) if args.control else control_argv,
            gw.env,
            gw.workdir / "control.log",
        )
        wait_until(lambda: gw.healthz() is not None, 240, "control healthz")
        gw.dataplane = Proc(
            _callgrind(module_argv("dataplane.main", tree), outs["dataplane"]), gw.env, gw.workdir / "dataplane.log"
        )
        gw.wait_synchronised(timeout_s=240)
        token = mint_token(gw)
        body = request_body(PLANS["default"], False).encode()
        request = build_request(
            "POST", "/v1/messages", f"127.0.0.1:{gw.dataplane_port}", {**ANTHROPIC_HEADERS, "x-api-key": token}, body
        )
        per = max(1, args.requests // args.connections)
        warm = asyncio.run(_drive(gw.dataplane_port, request, args.connections, max(5, per // 4)))
        pids = {"dataplane": gw.dataplane.popen.pid}
        if args.control:
            pids["control"] = gw.control.popen.pid
        for pid in pids.values():
            _control(pid, "-i", "on")
            _control(pid, "-z")
        done = asyncio.run(_drive(gw.dataplane_port, request, args.connections, per))
        for pid in pids.values():
            _control(pid, "-i", "off")
            _control(pid, "-d")
        if done != per * args.connections or not warm:
            raise SystemExit(f"only {done} of {per * args.connections} requests answered 2xx")
        try:
            wait_until(lambda: all(_total(outs[name]) for name in pids), 60, "callgrind dumps")
        except AssertionError:
            print(sorted(p.name for p in workdir.iterdir()), file=sys.stderr)
            for p in workdir.glob("*.cg*"):
                print(p.name, p.read_text(errors="replace")[-600:], file=sys.stderr)
            raise
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            for name in pids:
                for path in outs[name].parent.glob(outs[name].name + "*"):
                    shutil.copy(path, args.keep / f"{'base' if tree else 'this'}-{path.name}")
        return {name: _total(outs[name]) / done for name in pids}
    finally:
        gw.stop()
        stub.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", type=Path, help="other checkouts to measure too")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--control", action="store_true", help="count control's instructions too")
    parser.add_argument("--keep", type=Path, help="copy callgrind's output files here")
    parser.add_argument("--repeat", type=int, default=1, help="measure each checkout this often")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("bench.instructions: valgrind is not installed", file=sys.stderr)
        return 2
    columns: list[tuple[str, Path | None]] = [("this checkout", None)]
    columns += [(str(tree), tree.resolve()) for tree in args.trees]
    counts: dict[str, list[dict[str, float]]] = {}
    for _ in range(args.repeat):
        for name, tree in columns:
            with tempfile.TemporaryDirectory(prefix="leasehold-ir-") as tmp:
                per = measure(tree, Path(tmp), args)
            counts.setdefault(name, []).append(per)
            print(f"  {name:40s} " + "  ".join(f"{k} {v / 1e3:,.1f} k instr/req" for k, v in per.items()), flush=True)
    for name, _ in columns[1:]:
        print(ratio_text(f"this checkout / {name}", counts["this checkout"], counts[name]), flush=True)
    return 0


def ratio_text(label: str, mine: list[dict[str, float]], theirs: list[dict[str, float]]) -> str:
    """Instructions per request, this checkout's over another's, per process and for the pair
    (the mean of the repeats): above 1.0 this checkout executes more per request."""

    def mean(runs: list[dict[str, float]], process: str) -> float:
        return sum(run[process] for run in runs) / len(runs)

    processes = list(mine[0])
    ratios = [f"{p} {mean(mine, p) / mean(theirs, p):.3f}x" for p in processes]
    both = sum(mean(mine, p) for p in processes) / sum(mean(theirs, p) for p in processes)
    return f"  {label:40s} " + "  ".join(ratios) + (f"  together {both:.3f}x" if len(processes) > 1 else "")


if __name__ == "__main__":
    raise SystemExit(main())
