"""Waiting on a condition with a deadline: the one way a test waits, never a bare sleep.

`wait_until` polls from a thread (system tests, the harness); `until` polls inside the event
loop (in-process tests), yielding to the loop between probes so the thing awaited can run. Both
return the probe's first truthy value and fail naming what they waited for.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class ProcessExited(AssertionError):
    """A process a test waits on is gone: reported at once, never waited out as a deadline."""


def wait_until(probe: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.02) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` at the deadline.

    A probe that raises `ProcessExited` ends the wait at once (the process it needs is gone)."""
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while True:
        try:
            value = probe()
            if value:
                return value
        except ProcessExited:
            raise
        except Exception as exc:  # a probe may fail while the thing starts
            last_error = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last error: {last_error!r})")
        time.sleep(interval_s)


async def until(probe: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.005) -> T:
    """`wait_until` inside the event loop: the loop runs between probes (a probe may be a
    coroutine function, for state read from an async store)."""
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while True:
        try:
            value = probe()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
        except ProcessExited:
            raise
        except Exception as exc:  # a probe may fail while the thing starts
            last_error = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last error: {last_error!r})")
        await asyncio.sleep(interval_s)
