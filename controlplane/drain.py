"""Reads drain the data plane first (issue 27): a control answer holds every row finished before it.

The data plane sends the reports nobody waits for lazily (`shared/rpc.LAZY_FLUSH_S`) and holds a
short attempt's start (`dataplane/rpc_client.START_HOLD_S`), so without this a 2xx row, its spend
and the in-flight counts could reach control's views after the worker already has its answer.
Before a view or a mint answers (the `drains` flag of `controlplane/http/common.requires`,
checked once where a request is dispatched), `ReportDrain.drain` sends a `Drain` on the ordered
link: the data plane writes everything it held back, then the `Ack`; control's reader records the
rows ahead of the Ack in order, and the drain then waits for their settle. Reads that arrive while
a drain is in flight share the next one (at most two round trips under any polling); a data plane
that does not answer within `DRAIN_DEADLINE_S` does not hold the read: it answers as before,
counted (`late`) and logged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from controlplane.replication import DataPlaneLink
from shared.logging import get_logger

log = get_logger("control.drain")

# How long a read waits for the data plane's queued reports before it answers without them.
DRAIN_DEADLINE_S = 0.25


class ReportDrain:
    """The one `drain()` every row-reading answer awaits, coalesced across concurrent readers."""

    def __init__(
        self,
        link: DataPlaneLink,
        settled: Callable[[], Awaitable[object]],
        deadline_s: float = DRAIN_DEADLINE_S,
    ) -> None:
        self.link = link
        self.settled = settled  # waits until the rows recorded so far are settled
        self.deadline_s = deadline_s
        self.rounds = 0  # drains sent to a data plane
        self.late = 0  # rounds not answered (and settled) within the deadline
        self._current: asyncio.Task[bool] | None = None  # the round in flight
        self._next: asyncio.Task[bool] | None = None  # the round after it, not begun yet

    async def drain(self) -> bool:
        """Wait until every report the data plane queued before this call is recorded and
        settled; False when it could not be (no answer in time, the link lost), True when it was
        or no data plane is linked (then nothing is queued for us)."""
        if not self.link.connected:
            return True
        if self._next is not None:  # not begun yet: it begins after this read arrived
            return await asyncio.shield(self._next)
        if self._current is not None:  # begun before this read: its Ack may precede our rows
            self._next = asyncio.get_running_loop().create_task(self._round(after=self._current))
            return await asyncio.shield(self._next)
        self._current = asyncio.get_running_loop().create_task(self._round(after=None))
        return await asyncio.shield(self._current)

    async def _round(self, after: asyncio.Task[bool] | None) -> bool:
        if after is not None:
            await asyncio.wait([after])
            self._current, self._next = self._next, None
        try:
            if not self.link.connected:
                return True
            self.rounds += 1
            try:
                async with asyncio.timeout(self.deadline_s):
                    if not await self.link.drain(self.deadline_s):
                        return False  # the link was lost: nothing more will come on it
                    await self.settled()
                return True
            except TimeoutError:
                self.late += 1
                log.warning("dataplane_drain_late", deadline_ms=round(self.deadline_s * 1000), late=self.late)
                return False
        finally:
            if self._current is asyncio.current_task():
                self._current = None
