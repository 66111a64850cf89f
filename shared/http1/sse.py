"""Server-Sent Events on a `StreamResponse`, byte for byte as aiohttp-sse 2.2 frames them.

Headers `Content-Type: text/event-stream`, `Cache-Control: no-cache`, `Connection: keep-alive`,
`X-Accel-Buffering: no`; an event is `id: …`, `event: …`, one `data: …` line per line of the
data, each line ended by `sep`, then `sep`; a ping (`: ping` + sep + sep) every `ping_interval`
seconds from `prepare` until `stop_streaming`.
"""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING

from shared.http1.response import StreamResponse

if TYPE_CHECKING:
    from shared.http1.request import Request

_LINE_SEP = re.compile(r"\r\n|\r|\n")


class EventSourceResponse(StreamResponse):
    DEFAULT_PING_INTERVAL = 15.0

    def __init__(self, *, status: int = 200, headers: dict[str, str] | None = None, sep: str = "\r\n") -> None:
        super().__init__(status=status, headers=headers)
        self.headers["Content-Type"] = "text/event-stream"
        self.headers["Cache-Control"] = "no-cache"
        self.headers["Connection"] = "keep-alive"
        self.headers["X-Accel-Buffering"] = "no"
        self.ping_interval = self.DEFAULT_PING_INTERVAL
        self._sep = sep
        self._ping_task: asyncio.Task[None] | None = None

    async def prepare(self, request: Request) -> None:
        if not self.prepared:
            await super().prepare(request)
            self._ping_task = asyncio.create_task(self._ping())

    async def send(self, data: str, id: str | None = None, event: str | None = None) -> None:
        sep = self._sep
        lines = []
        if id is not None:
            lines.append(_LINE_SEP.sub("", f"id: {id}") + sep)
        if event is not None:
            lines.append(_LINE_SEP.sub("", f"event: {event}") + sep)
        lines += [f"data: {chunk}{sep}" for chunk in _LINE_SEP.split(data)]
        lines.append(sep)
        try:
            await self.write("".join(lines).encode("utf-8"))
        except ConnectionResetError:
            self.stop_streaming()
            raise

    def stop_streaming(self) -> None:
        if self._ping_task is None:
            raise RuntimeError("Response is not started")
        self._ping_task.cancel()

    async def _ping(self) -> None:
        message = f": ping{self._sep}{self._sep}".encode()
        while True:
            await asyncio.sleep(self.ping_interval)
            try:
                await self.write(message)
            except (ConnectionResetError, RuntimeError):
                break
