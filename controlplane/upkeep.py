"""Background upkeep tied to the control app's life: one `cleanup_ctx` for every periodic task."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any


async def while_app_runs(loop_fn: Callable[[], Coroutine[Any, Any, None]]) -> AsyncIterator[None]:
    """Run `loop_fn()` from the app's start until its cleanup, then cancel it and wait."""
    task = asyncio.create_task(loop_fn())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
