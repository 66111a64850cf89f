"""Reader processes: a CPU-bound read of a large request body, off this process's GIL (SPEC §19).

msgspec holds the GIL for a whole parse, so a parse in a worker thread stalls the event loop as
long as one on it: ~16-19 ms per MiB of a worst-shaped body (`[0,0,...]`, many tiny members), so
~0.6 s for one just under the 32 MiB default limit (bench/README.md, "Stop 30"). A large body is
read by a reader process instead: the loop only writes its bytes to a socket (non-blocking writes
of slices of it, no copy) and awaits a small answer.

- Lazy: no process exists until the first large body, and one idle for `IDLE_S` exits, so an
  idle data plane holds none.
- Bounded: at most `READERS` processes, each reading one body at a time; other bodies wait.
- Isolated: a fresh interpreter (`-I`, an empty environment: no credential reaches it) that
  imports only what its read needs. Its life is its socket: it exits at EOF (its data plane
  closed it, or died) and ignores SIGINT and SIGTERM (its data plane drains first).
- Fallible: a reader that dies, answers out of protocol or takes longer than `ANSWER_S` is
  killed and `ReaderLost` raised (the caller answers 500 `internal-error`, counted in `lost`);
  the next body gets a fresh reader.

A request is a kind byte, an 8-byte big-endian length and that many bytes; an answer the same.
This module knows nothing of what is read: the child runs `entry` (`"module:function"`, called
with the socket's file descriptor), which calls `serve` with its answer function.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

READERS = 2  # reader processes at most (the others' bodies wait their turn)
ANSWER_S = 60.0  # a reader that has not answered by then is lost (a 32 MiB parse takes < 1 s)
IDLE_S = 60.0  # a reader idle this long exits (its memory returns)
NICE = 5  # a reader runs at this niceness above its data plane's
_HEAD = struct.Struct(">BQ")  # a request: its kind and its length
_ROOT = str(Path(__file__).resolve().parents[1])
_SEND_BUFFER = 1 << 20


class ReaderLost(Exception):
    """The reader process died, broke the protocol or did not answer in time."""


class _Reader:
    __slots__ = ("popen", "sock", "idle_since")

    def __init__(self, popen: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.popen = popen
        self.sock = sock
        self.idle_since = 0.0

    def close(self, kill: bool) -> None:
        """Close its socket (it exits at EOF); kill it too if it may be mid-read."""
        self.sock.close()
        if kill and self.popen.poll() is None:
            self.popen.kill()

    async def exchange(self, kind: int, payload: bytes, most: int) -> bytearray:
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(self.sock, _HEAD.pack(kind, len(payload)))
        await loop.sock_sendall(self.sock, memoryview(payload))
        _, size = _HEAD.unpack(await self._exactly(_HEAD.size))
        if size > most:
            raise ReaderLost(f"an answer of {size} bytes")
        return await self._exactly(size)  # no copy: a rewritten body is as large as the body

    async def _exactly(self, size: int) -> bytearray:
        loop = asyncio.get_running_loop()
        data = bytearray(size)
        view = memoryview(data)
        got = 0
        while got < size:
            n = await loop.sock_recv_into(self.sock, view[got:])
            if n == 0:
                raise ReaderLost("the reader closed its socket")
            got += n
        return data


class Readers:
    """A lazily started, bounded set of reader processes running `entry`; one per event loop."""

    def __init__(self, entry: str, most: int = READERS, answer_s: float = ANSWER_S, idle_s: float = IDLE_S):
        self.entry = entry
        self.most = most
        self.answer_s = answer_s
        self.idle_s = idle_s
        self.started = 0  # reader processes started
        self.lost = 0  # readers lost (died, out of protocol, too slow)
        self._idle: list[_Reader] = []
        self._busy: set[_Reader] = set()
        self._exiting: list[subprocess.Popen[bytes]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._turns: asyncio.Semaphore | None = None
        self._reaping: asyncio.TimerHandle | None = None

    def pids(self) -> list[int]:
        """The reader processes alive now (idle or busy)."""
        return [r.popen.pid for r in (*self._idle, *self._busy) if r.popen.poll() is None]

    async def ask(self, payload: bytes, kind: int = 0, most: int = 1 << 16) -> bytearray:
        """A reader's answer (at most `most` bytes) to a request of `kind` (its entry's own
        vocabulary) about `payload`; ReaderLost if it cannot be had."""
        turns = self._turns_here()
        async with turns:
            reader = self._take()
            self._busy.add(reader)
            try:
                async with asyncio.timeout(self.answer_s):
                    answer = await reader.exchange(kind, payload, most)
            except BaseException as exc:  # mid-frame: the reader cannot be reused
                self._busy.discard(reader)
                self._drop(reader, kill=True)
                if isinstance(exc, (OSError, TimeoutError, ReaderLost)):
                    self.lost += 1
                    raise ReaderLost(f"the body's reader was lost ({type(exc).__name__})") from None
                raise
            self._busy.discard(reader)
            reader.idle_since = asyncio.get_running_loop().time()
            self._idle.append(reader)
            self._schedule_reap()
            return answer

    def _turns_here(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._turns is None:  # a new loop (tests run several)
            self.close_now()
            self._loop, self._turns = loop, asyncio.Semaphore(self.most)
        return self._turns

    def _take(self) -> _Reader:
        while self._idle:
            reader = self._idle.pop()
            if reader.popen.poll() is None:
                return reader
            self._drop(reader, kill=False)  # it died while idle: not the next body's fault
        return self._start()

    def _start(self) -> _Reader:
        ours, theirs = socket.socketpair()
        module, function = self.entry.split(":")
        code = (
            f"import sys; sys.path.insert(0, {_ROOT!r}); from {module} import {function}; {function}({theirs.fileno()})"
        )
        try:
            popen = subprocess.Popen(
                [sys.executable, "-I", "-c", code],
                pass_fds=(theirs.fileno(),),
                env={},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        except OSError as exc:
            ours.close()
            self.lost += 1
            raise ReaderLost(f"no reader process could start ({exc.strerror})") from None
        finally:
            theirs.close()
        self.started += 1
        try:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)
        except OSError:
            pass
        ours.setblocking(False)
        return _Reader(popen, ours)

    def _drop(self, reader: _Reader, kill: bool) -> None:
        reader.close(kill)
        self._exiting.append(reader.popen)

    def _schedule_reap(self) -> None:
        if self._reaping is None and self._loop is not None:
            self._reaping = self._loop.call_later(self.idle_s, self._reap)

    def _reap(self) -> None:
        """Close readers idle for `idle_s`, and collect the exit of those closed before."""
        self._reaping = None
        assert self._loop is not None
        now = self._loop.time()
        for reader in [r for r in self._idle if now - r.idle_since >= self.idle_s]:
            self._idle.remove(reader)
            self._drop(reader, kill=False)
        self._exiting = [p for p in self._exiting if p.poll() is None]
        if self._idle or self._exiting:
            self._schedule_reap()

    def close_now(self) -> None:
        """Close every reader (busy ones are killed); their exits are collected by `closed`."""
        if self._reaping is not None:
            self._reaping.cancel()
            self._reaping = None
        for reader in self._idle:
            self._drop(reader, kill=False)
        for reader in self._busy:
            self._drop(reader, kill=True)
        self._idle, self._busy = [], set()
        self._loop, self._turns = None, None

    async def closed(self, timeout_s: float = 2.0) -> None:
        """Close every reader and wait (bounded) until each has exited; kill what has not."""
        self.close_now()
        exiting, self._exiting = self._exiting, []
        for popen in exiting:
            try:
                await asyncio.to_thread(popen.wait, timeout_s)
            except subprocess.TimeoutExpired:
                popen.kill()
                await asyncio.to_thread(popen.wait, timeout_s)


def serve(fd: int, answer: Callable[[int, bytes], bytes]) -> None:
    """A reader process's loop: a request in, `answer(kind, payload)` out, until EOF on `fd`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.nice(NICE)  # its data plane's loop wins a contended core (bench/README.md, Stop 30)
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    while True:
        head = _read(sock, _HEAD.size)
        if head is None:
            return
        kind, size = _HEAD.unpack(head)
        body = _read(sock, size)
        if body is None:
            return
        out = answer(kind, bytes(body))
        try:
            sock.sendall(_HEAD.pack(kind, len(out)))
            sock.sendall(out)
        except OSError:
            return


def _read(sock: socket.socket, size: int) -> bytearray | None:
    data = bytearray(size)
    view = memoryview(data)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            return None
        got += n
    return data
