"""Background upkeep tied to the control app's life: one `cleanup_ctx` for every periodic task."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from shared.logging import get_logger

log = get_logger("control")


async def every(tick_s: float, tick: Callable[[], object], failed_event: str) -> None:
    """Call `tick()` every `tick_s` for ever; a pass that raises is logged as `failed_event` and
    the next one runs (upkeep must outlive any one bad pass)."""
    while True:
        await asyncio.sleep(tick_s)
        try:
            tick()
        except Exception:
            log.exception(failed_event)


async def while_app_runs(loop_fn: Callable[[], Coroutine[Any, Any, None]]) -> AsyncIterator[None]:
    """Run `loop_fn()` from the app's start until its cleanup, then cancel it and wait."""
    task = asyncio.create_task(loop_fn())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
