"""Process helpers for system tests: the stub and both daemons as real processes on loopback.

Every wait is on a condition with a deadline (`tests/support/waits.py`), never a bare sleep.
Every process started here is stopped by its owner (`Gateway.stop`, `Proc.stop`), and each
daemon's output is captured to a file the test can read (for the secret-absence checks).
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.ledgerfiles import rows_on_disk
from tests.support.waits import ProcessExited, wait_until  # also imported from here by bench/

REPO = Path(__file__).resolve().parents[2]


# Ports for the daemons are picked in [PORT_FLOOR, the ephemeral range's start).
PORT_FLOOR = 20000
PORT_TRIES = 64
# Ports already handed out by this process: a gateway picks its two ports before either daemon
# binds, so both can find the same port free and the second daemon then exits EADDRINUSE.
_HANDED: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports it picks itself (bind to 0, a connect's local port)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return low, high


def free_port() -> int:
    """A free loopback port for a daemon to listen on, below the ephemeral range.

    Between this choice and the daemon's bind, nothing else may take the port. A port from the
    ephemeral range (bind to 0) can be the local port of any outgoing connection meanwhile —
    and such a connection closed first leaves a TIME_WAIT that refuses the daemon's bind for a
    minute (EADDRINUSE, SO_REUSEADDR or not) — so the daemon would exit at once; below that
    range only another explicit bind competes, and the port is checked free here. A port is
    handed out once per process: two picks before either bind (a gateway's two daemons, started
    at once) never get the same port.
    """
    low, _high = ephemeral_range()
    if len(_HANDED) > (low - PORT_FLOOR) // 2:  # a very long session: old ports are long closed
        _HANDED.clear()
    for _ in range(PORT_TRIES if low - PORT_FLOOR > 1000 else 0):
        port = random.randrange(PORT_FLOOR, low)
        if port in _HANDED:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            _HANDED.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # an unusual range: the kernel's
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# The signals tests send to the processes they start. Whoever started pytest may have ignored
# them (a shell's background job ignores SIGINT, nohup ignores SIGHUP) and an ignored signal
# stays ignored across fork and exec: a child a test signals gets its defaults back first.
SIGNALS_SENT = (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)


def default_signals() -> None:
    """`preexec_fn` of a child a test will signal: the dispositions it relies on, not inherited."""
    for sig in SIGNALS_SENT:
        signal.signal(sig, signal.SIG_DFL)


def base_env() -> dict[str, str]:
    """A clean environment for a child: no inherited GATEWAY_*, the repo importable."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR", "SYSTEMROOT")}
    keep["PYTHONPATH"] = str(REPO)
    keep["PYTHONUNBUFFERED"] = "1"
    return keep


class Proc:
    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.argv = argv
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self._log_start = os.path.getsize(log_path)  # an earlier process's output is not its own
        self.popen = subprocess.Popen(
            argv,
            env=env,
            cwd=str(REPO),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=default_signals,
        )
        self._terminated = False

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def terminate(self) -> None:
        """SIGTERM without waiting (several processes stopping at once); `stop` then waits."""
        if self.alive and not self._terminated:
            self.popen.send_signal(signal.SIGTERM)
            self._terminated = True

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> int | None:
        if self.alive:
            if not (sig == signal.SIGTERM and self._terminated):  # never a second SIGTERM
                self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self._log.close()
        return self.popen.returncode

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def tail(self, size: int = 16384) -> bytes:
        """The last `size` bytes of this process's output (a cheap probe while it ends)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(self._log_start, f.seek(0, os.SEEK_END) - size))
                return f.read()
        except OSError:
            return b""

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def require_alive(self, name: str) -> bool:
        """True while the process runs; `ProcessExited` with its status and last words once not."""
        if self.alive:
            return True
        tail = "\n".join(self.output().splitlines()[-15:])
        raise ProcessExited(f"the {name} exited with status {self.popen.returncode}; its output ends:\n{tail}")


def credential_like(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(30).replace("-", "x").replace("_", "y")


class Stub:
    """The stub upstream as a process; `steps()` / `requests()` drive and observe it."""

    def __init__(
        self, workdir: Path, anthropic_key: str | None, openai_key: str | None, *, rate_limit_headers: bool = False
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        port_file = workdir / f"stub-{secrets.token_hex(3)}.port"
        argv = [sys.executable, "-m", "tests.support.stub_upstream", "--port", "0", "--port-file", str(port_file)]
        if rate_limit_headers:  # a provider's rate-limit headers on every answer (stub_ratelimits)
            argv.append("--rate-limit-headers")
        if anthropic_key:
            argv += ["--anthropic-key", anthropic_key]
        if openai_key:
            argv += ["--openai-key", openai_key]
        self.anthropic_key = anthropic_key
        self.openai_key = openai_key
        self.proc = Proc(argv, base_env(), workdir / (port_file.stem + ".log"))
        port = wait_until(
            lambda: self.proc.require_alive("stub upstream") and port_file.exists() and port_file.read_text().strip(),
            20,
            "stub port",
        )
        self.url = f"http://127.0.0.1:{int(port)}"
        wait_until(lambda: http("GET", self.url + "/_stub/health")[0] == 200, 20, "stub health")

    def script(self, *steps: dict[str, Any]) -> None:
        http("POST", self.url + "/_stub/script", {"steps": list(steps)})

    def reset(self) -> None:
        http("DELETE", self.url + "/_stub/script")
        http("DELETE", self.url + "/_stub/requests")

    def release(self, name: str) -> None:
        """Let a stream scripted with `"hold": name` go on (`hold_after_events`)."""
        http("POST", self.url + "/_stub/release?name=" + name)

    def requests(self) -> list[dict[str, Any]]:
        return http("GET", self.url + "/_stub/requests")[2]

    def stop(self) -> None:
        self.proc.stop()


def http(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None, timeout_s: float = 30.0
) -> tuple[int, dict[str, str], Any]:
    """One HTTP exchange; returns (status, lower-cased headers, decoded JSON or text)."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if data is not None and "Content-Type" not in request.headers:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status, raw, got = response.status, response.read(), response.headers
    except urllib.error.HTTPError as err:
        status, raw, got = err.code, err.read(), err.headers
    text = raw.decode("utf-8", "replace")
    try:
        payload: Any = json.loads(text) if text else None
    except ValueError:
        payload = text
    return status, {k.lower(): v for k, v in got.items()}, payload


class Gateway:
    """Control daemon + data plane as processes, wired to `stub` as the legacy accounts."""

    def __init__(self, workdir: Path, stub: Stub | None, extra_env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.state_dir = workdir / "state"
        self.runtime_dir = workdir / "run"
        self.control_token = credential_like("ctl_")
        self.control_port = free_port()
        self.dataplane_port = free_port()
        self.control_url = f"http://127.0.0.1:{self.control_port}"
        self.dataplane_url = f"http://127.0.0.1:{self.dataplane_port}"
        self.env = base_env()
        self.env.update(
            {
                "GATEWAY_STATE_DIR": str(self.state_dir),
                "GATEWAY_RUNTIME_DIR": str(self.runtime_dir),
                "GATEWAY_CONTROL_LISTEN": f"127.0.0.1:{self.control_port}",
                "GATEWAY_DATAPLANE_LISTEN": f"127.0.0.1:{self.dataplane_port}",
                "GATEWAY_CONTROL_TOKEN": self.control_token,
                "GATEWAY_DRAIN_SECONDS": "5",
            }
        )
        if stub is not None:
            if stub.anthropic_key:
                self.env["GATEWAY_ANTHROPIC_BASE_URL"] = stub.url
                self.env["GATEWAY_ANTHROPIC_API_KEY"] = stub.anthropic_key
                self.env["GATEWAY_ZAI_BASE_URL"] = stub.url
                self.env["GATEWAY_ZAI_API_KEY"] = stub.anthropic_key
            if stub.openai_key:
                self.env["GATEWAY_OPENAI_BASE_URL"] = stub.url
                self.env["GATEWAY_OPENAI_API_KEY"] = stub.openai_key
        self.env.update(extra_env or {})
        self.control: Proc | None = None
        self.dataplane: Proc | None = None

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> Gateway:
        """Both daemons at once, as systemd starts them (the data plane dials control's socket
        until it opens): their start-ups overlap rather than add up."""
        self.spawn_control()
        self.start_dataplane()
        self.wait_control()
        self.wait_synchronised()
        return self

    def start_control(self) -> None:
        self.spawn_control()
        self.wait_control()

    def spawn_control(self) -> None:
        self.control = Proc([sys.executable, "-m", "controlplane.main"], self.env, self.workdir / "control.log")

    def wait_control(self) -> None:
        wait_until(
            lambda: self.control.require_alive("control daemon") and self.healthz() is not None, 20, "control healthz"
        )

    def start_dataplane(self) -> None:
        self.dataplane = Proc([sys.executable, "-m", "dataplane.main"], self.env, self.workdir / "dataplane.log")

    def wait_synchronised(self, timeout_s: float = 20) -> None:
        """Until control reports *this* data plane process synchronised."""

        def synced() -> bool:
            self.control.require_alive("control daemon")  # a daemon that died is reported
            self.dataplane.require_alive("data plane")  # now, not after the deadline
            health = self.healthz() or {}
            return bool(health.get("dataplane_connected")) and health.get("dataplane_pid") == self.dataplane.popen.pid

        wait_until(synced, timeout_s, "data plane synchronised with control")

    def healthz(self) -> dict[str, Any] | None:
        try:
            status, _, body = http("GET", self.control_url + "/healthz", timeout_s=2)
        except OSError:
            return None
        return body if status == 200 else None

    def stop(self) -> None:
        stop_all([self])

    def logs(self) -> str:
        return "".join(p.output() for p in (self.control, self.dataplane) if p is not None)

    # ---- control API --------------------------------------------------------------------

    def api(
        self, method: str, path: str, body: Any = None, token: str | None = "admin"
    ) -> tuple[int, dict[str, str], Any]:
        headers = {}
        bearer = self.control_token if token == "admin" else token
        if bearer:
            headers["Authorization"] = f"Bearer {bearer}"
        return http(method, self.control_url + path, body, headers)

    def mint(self, binding: str = "anthropic", **fields: Any) -> dict[str, Any]:
        body = {
            "provider_binding": binding,
            "principal_kind": "worker",
            "principal_id": "w-1",
            "repo_slug": "acme/app",
            **fields,
        }
        status, _, payload = self.api("POST", "/control/v1/keys", body)
        assert status == 201, (status, payload)
        return payload

    def revoke(self, key_id: str) -> bool:
        status, _, payload = self.api("DELETE", f"/control/v1/keys/{key_id}")
        assert status == 200, (status, payload)
        return payload["revoked"]

    def recent(self, limit: int = 200) -> dict[str, Any]:
        return self.api("GET", f"/control/v2/routes/recent?limit={limit}")[2]

    def active(self) -> dict[str, Any]:
        return self.api("GET", "/control/v2/routes/active")[2]

    def ledger(self) -> list[dict[str, Any]]:
        """Every row on disk, oldest first: the rotated segments (SPEC §18), then ledger.jsonl."""
        return rows_on_disk(self.state_dir)

    def wait_rows(self, count: int, timeout_s: float = 10) -> list[dict[str, Any]]:
        return wait_until(
            lambda: (rows := self.ledger()) and len(rows) >= count and rows, timeout_s, f"{count} ledger rows"
        )


def start_all(gateways: list[Gateway]) -> None:
    """Start several gateways at once (every daemon spawned first, then each waited for)."""
    for gw in gateways:
        gw.spawn_control()
        gw.start_dataplane()
    for gw in gateways:
        gw.wait_control()
        gw.wait_synchronised()


DATAPLANE_DONE = b'"event":"dataplane_stopped"'  # its last rows acknowledged, its link closed


def stop_all(gateways: list[Gateway], timeout_s: float = 15.0) -> None:
    """Stop several gateways at once: every data plane first (its last rows reach its control),
    then every control. A control is signalled once its data plane has exited or said it
    stopped (rows flushed, link closed): the data plane's interpreter exit overlaps control's."""
    planes = [gw.dataplane for gw in gateways if gw.dataplane is not None]
    controls = [gw.control for gw in gateways if gw.control is not None]
    for proc in planes:
        proc.terminate()
    deadline = time.monotonic() + timeout_s
    while any(p.alive and DATAPLANE_DONE not in p.tail() for p in planes) and time.monotonic() < deadline:
        time.sleep(0.02)
    for proc in controls:
        proc.terminate()
    for proc in planes + controls:
        proc.stop()
