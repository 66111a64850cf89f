"""A real `redis-server` for the fleet tests: loopback only, no persistence, stopped by its owner.

`RedisServer(tmp).start()` picks a free loopback port, starts `redis-server` with nothing saved
(`--save '' --appendonly no`) in its own directory and waits for `PING` with a deadline. The
tests that need the server misbehaving use `pause()` (SIGSTOP), `resume()` (SIGCONT), `stop()`
and `start()` again on the same port. `require_redis_server()` is the one check for the binary:
a missing one fails the test (in CI and locally alike, never a skip), naming the command that
installs it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.support.harness import free_port

INSTALL = "apt-get install -y redis-server"
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0


def require_redis_server() -> str:
    """The path of `redis-server`; fails (never skips) when it is not installed."""
    path = shutil.which("redis-server")
    if path is None:
        where = (
            "CI must provide it (make test installs it as root)"
            if os.environ.get("CI")
            else "install it with the one command"
        )
        raise RuntimeError(f"redis-server is not on PATH; {where}: {INSTALL}")
    return path


def ping(port: int, timeout_s: float = 0.5) -> bool:
    """One `PING` over a plain socket (no client library, so it also works while one is broken)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, directory: Path, port: int | None = None, extra_args: list[str] | None = None) -> None:
        self.extra_args = list(extra_args or [])  # more redis-server options (TLS, ACL users)
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.popen: subprocess.Popen[bytes] | None = None
        self._log = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self) -> RedisServer:
        binary = require_redis_server()
        argv = [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.directory),
            "--protected-mode",
            "yes",
            "--daemonize",
            "no",
            *self.extra_args,
        ]
        self._log = open(self.directory / "redis.log", "ab")
        self.popen = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ping(self.port):  # a condition with a deadline, and an early exit noticed
            if self.popen.poll() is not None or time.monotonic() > deadline:
                log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise ServerExited(f"redis-server on port {self.port} did not answer PING:\n{log}")
            time.sleep(0.02)
        return self

    def pause(self) -> None:
        """SIGSTOP: the socket stays open and accepts, nothing answers (a hung server)."""
        assert self.popen is not None
        self.popen.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.popen is not None
        self.popen.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.popen is not None:
            if self.popen.poll() is None:
                self.popen.send_signal(signal.SIGCONT)  # a paused server cannot act on SIGTERM
                self.popen.terminate()
                try:
                    self.popen.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self.popen.kill()
                    self.popen.wait(STOP_TIMEOUT_S)
            self.popen = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def restart(self) -> None:
        """Stop and start again on the same port, with nothing kept (the data-loss case)."""
        self.stop()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # the port can linger for a moment after the old process is gone
            try:
                self.start()
                return
            except ServerExited:
                if time.monotonic() > deadline:
                    raise


class ServerExited(RuntimeError):
    """redis-server exited (or stayed silent) before answering PING."""
