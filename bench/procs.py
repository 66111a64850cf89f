"""Processes of a benchmark run: the servers under test, the load generator, /proc readings.

Rule: every server is a real process on loopback, started and stopped here (the stub and the
gateway through `tests/support/harness.py`, exactly as the system tests start them), and every
wait is on a condition with a deadline. The CPU layout is decided once (`Layout`): on a machine
with two or more cores the generator gets core 0 and the servers the rest, so the two never
compete for one core; the layout goes into the results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import msgspec

from tests.support.harness import REPO, Gateway, Proc, Stub, base_env, credential_like, wait_until

MINT_BODY = {
    "provider_binding": "anthropic",
    "principal_kind": "worker",
    "principal_id": "bench",
    "repo_slug": "bench/run",
    "ttl_seconds": 86400,
}


class Layout(msgspec.Struct, frozen=True, kw_only=True):
    """Which CPUs the load generator and the servers may use (None: no pinning)."""

    generator_cpus: tuple[int, ...] | None
    server_cpus: tuple[int, ...] | None

    @classmethod
    def decide(cls, available: set[int], pin: bool) -> Layout:
        cpus = sorted(available)
        if not pin or len(cpus) < 2:
            return cls(generator_cpus=None, server_cpus=None)
        return cls(generator_cpus=(cpus[0],), server_cpus=tuple(cpus[1:]))

    def describe(self) -> str:
        if self.generator_cpus is None:
            return "unpinned (generator and servers share every core)"
        return (
            f"generator pinned to CPU {','.join(map(str, self.generator_cpus))}; "
            f"servers to CPU {','.join(map(str, self.server_cpus or ()))}"
        )


# ---- /proc ------------------------------------------------------------------------------------


def status_kib(pid: int, field: str) -> int | None:
    """A `kB` field of /proc/PID/status (VmRSS, VmHWM), or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_kib(pid: int) -> int | None:
    return status_kib(pid, "VmRSS")


def hwm_kib(pid: int) -> int | None:
    return status_kib(pid, "VmHWM")


# ---- the load generator as a process ----------------------------------------------------------


LOADGEN_ARGV = [sys.executable, "-m", "bench.loadgen"]


def run_loadgen(job: dict[str, Any], timeout_s: float = 300) -> dict[str, Any]:
    """Run one scenario in a fresh generator process (job on stdin) and return its result."""
    done = subprocess.run(
        LOADGEN_ARGV,
        input=json.dumps(job) + "\n",
        env=base_env(),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["result"]


class HeldStreams:
    """A `hold` scenario: streams stay open until `release()`."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.popen = subprocess.Popen(
            LOADGEN_ARGV,
            env=base_env(),
            cwd=str(REPO),
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.popen.stdin.write(json.dumps(job) + "\n")
        self.popen.stdin.flush()
        line = self.popen.stdout.readline()
        if not line:
            raise RuntimeError(f"load generator failed: {self.popen.stderr.read()[-2000:]}")  # type: ignore[union-attr]
        self.state: dict[str, Any] = json.loads(line)

    def release(self, timeout_s: float = 60) -> dict[str, Any]:
        out, err = self.popen.communicate("release\n", timeout=timeout_s)
        if self.popen.returncode != 0:
            raise RuntimeError(f"load generator failed: {err[-2000:]}")
        return json.loads(out.strip().splitlines()[-1])["result"]


# ---- servers ----------------------------------------------------------------------------------


class Target(msgspec.Struct, kw_only=True):
    """Where the generator sends a column's traffic, and which processes to watch."""

    name: str
    host: str
    port: int
    path: str
    headers: dict[str, str]
    pids: dict[str, int]
    stream_step_header: bool = True  # False: the stub is scripted through its FIFO instead


def start_stub(workdir: Path) -> Stub:
    """The stub as the benchmark's provider: every answer carries a real provider's full
    rate-limit header set, so the data plane parses them as it does in production (SPEC §22)."""
    return Stub(workdir, anthropic_key=credential_like("sk-ant-api03-"), openai_key=None, rate_limit_headers=True)


def start_minimal_proxy(workdir: Path, upstream: str) -> tuple[Proc, int]:
    """The floor proxy as a process; returns (process, port)."""
    port_file = workdir / "minimal-proxy.port"
    proc = Proc(
        [sys.executable, "-m", "bench.minimal_proxy", "--upstream", upstream, "--port-file", str(port_file)],
        base_env(),
        workdir / "minimal-proxy.log",
    )
    wait_until(lambda: port_file.exists() or not proc.alive, 20, "minimal proxy port")
    assert proc.alive, proc.output()
    return proc, int(port_file.read_text())


def tree_python(tree: Path) -> str:
    """The interpreter another checkout's daemons run with: its own `.venv`'s when it has one
    (its dependencies as its `setup.cfg` pins them), else this one's."""
    own = tree / ".venv" / "bin" / "python"
    return str(own) if own.exists() else sys.executable


def module_argv(module: str, tree: Path | None = None) -> list[str]:
    """`python -m module`, or the same module imported from another checkout `tree`."""
    if tree is None:
        return [sys.executable, "-m", module]
    code = (
        f"import runpy, sys; sys.path.insert(0, {str(tree)!r}); "
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    )
    return [tree_python(tree), "-c", code]


def start_gateway(workdir: Path, stub: Stub, env: dict[str, str] | None = None, tree: Path | None = None) -> Gateway:
    """Control + data plane as the system tests run them (logs to files in `workdir`); with
    `tree`, the daemons' code comes from that checkout (to compare two versions in one run)."""
    gw = Gateway(workdir, stub, env)
    if tree is None:
        return gw.start()
    gw.control = Proc(module_argv("controlplane.main", tree), gw.env, workdir / "control.log")
    wait_until(lambda: gw.healthz() is not None or not gw.control.alive, 20, "control healthz")
    assert gw.control.alive, gw.control.output()[-2000:]
    gw.dataplane = Proc(module_argv("dataplane.main", tree), gw.env, workdir / "dataplane.log")
    gw.wait_synchronised()
    return gw


def mint_token(gateway: Gateway) -> str:
    return gateway.mint(**{k: v for k, v in MINT_BODY.items() if k != "provider_binding"})["token"]


class Servers:
    """The stub, the minimal proxy and Leasehold (plus any variants), up for the whole run;
    `close()` stops all. A variant is Leasehold from another checkout: ("leasehold@NAME", tree)."""

    def __init__(self, workdir: Path, gateway_env: dict[str, str] | None = None, trees: tuple[Path, ...] = ()) -> None:
        self.workdir = workdir
        self._stack = ExitStack()
        try:
            self.stub = start_stub(workdir / "stub")
            self._stack.callback(self.stub.stop)
            self.minimal, self.minimal_port = start_minimal_proxy(workdir, self.stub.url)
            self._stack.callback(self.minimal.stop)
            self.gateway = start_gateway(workdir / "leasehold", self.stub, gateway_env)
            self._stack.callback(self.gateway.stop)
            self.token = mint_token(self.gateway)
            self.variants: list[tuple[str, Gateway, str]] = []
            for tree in trees:
                name = f"leasehold@{tree.resolve().name}"
                gw = start_gateway(workdir / name, self.stub, gateway_env, tree.resolve())
                self._stack.callback(gw.stop)
                self.variants.append((name, gw, mint_token(gw)))
        except BaseException:
            self._stack.close()
            raise

    def targets(self, path: str, common: dict[str, str]) -> list[Target]:
        stub_port = int(self.stub.url.rsplit(":", 1)[1])
        stub_pid = self.stub.proc.popen.pid
        key = {"x-api-key": self.stub.anthropic_key or ""}
        gw = self.gateway
        return [
            Target(
                name="direct",
                host="127.0.0.1",
                port=stub_port,
                path=path,
                headers={**common, **key},
                pids={"stub": stub_pid},
            ),
            Target(
                name="minimal-proxy",
                host="127.0.0.1",
                port=self.minimal_port,
                path=path,
                headers={**common, **key},
                pids={"minimal-proxy": self.minimal.popen.pid, "stub": stub_pid},
            ),
            *(
                _leasehold_target(name, variant, token, path, common, stub_pid)
                for name, variant, token in [("leasehold", gw, self.token), *self.variants]
            ),
        ]

    def gateway_named(self, name: str) -> Gateway | None:
        if name == "leasehold":
            return self.gateway
        return next((gw for n, gw, _ in self.variants if n == name), None)

    def add(self, stop: Any) -> None:
        self._stack.callback(stop)

    def close(self) -> None:
        self._stack.close()


def _leasehold_target(name: str, gw: Gateway, token: str, path: str, common: dict[str, str], stub_pid: int) -> Target:
    assert gw.dataplane is not None and gw.control is not None
    return Target(
        name=name,
        host="127.0.0.1",
        port=gw.dataplane_port,
        path=path,
        headers={**common, "x-api-key": token},
        pids={"dataplane": gw.dataplane.popen.pid, "control": gw.control.popen.pid, "stub": stub_pid},
    )


def pin_self(cpus: tuple[int, ...] | None) -> None:
    """Pin this process (and so every server it starts afterwards) to `cpus`."""
    if cpus is not None:
        os.sched_setaffinity(0, set(cpus))
