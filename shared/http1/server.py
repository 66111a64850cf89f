"""Listening, and stopping gracefully: stop accepting, run the app's `on_shutdown` (control's
event feeds end there), close idle keep-alive connections at once and busy ones after their
answer, cut what is still open after `Limits.shutdown_grace_s`, then leave the app's
`cleanup_ctx` loops (`stop_listening` first, alone, lets the open connections go on meanwhile: the
data plane's drain window). `refused` counts what the connections refused, by reason.
`handler_cancellation`, `hand_off` and `over_cap` are the data plane's (`protocol.Connection`)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

from shared.http1.app import Application
from shared.http1.errors import Refused
from shared.http1.headers import DateValue
from shared.http1.limits import DEFAULT_LIMITS, Limits
from shared.http1.protocol import Connection
from shared.http1.request import Request


class Server:
    def __init__(
        self,
        app: Application,
        limits: Limits = DEFAULT_LIMITS,
        refused: Counter[Refused] | None = None,
        *,
        handler_cancellation: bool = False,
        hand_off: Callable[[Connection, Request, bytes], None] | None = None,
        over_cap: Callable[[], bytes] | None = None,
    ) -> None:
        self.app, self.limits = app, limits
        self.handler_cancellation = handler_cancellation  # a peer's close cancels its request
        self.hand_off = hand_off  # an `Upgrade: websocket` request's connection goes there
        self.over_cap = over_cap  # the bytes a connection past `limits.max_connections` is sent
        self.date = DateValue()
        self.refused: Counter[Refused] = Counter() if refused is None else refused  # the owner's, to expose
        self.connections: set[Connection] = set()
        self.closing = False
        self._listener: asyncio.Server | None = None
        self._emptied: asyncio.Event | None = None

    async def start(self, host: str, port: int, *, reuse_address: bool = True, backlog: int = 100) -> None:
        """The app's `cleanup_ctx` entered, then the listener opened (an OSError if it cannot be)."""
        await self.app.startup()
        loop = asyncio.get_running_loop()
        try:
            self._listener = await loop.create_server(
                lambda: Connection(self), host, port, reuse_address=reuse_address, backlog=backlog
            )
        except OSError:
            await self.app.cleanup()
            raise

    @property
    def port(self) -> int:
        assert self._listener is not None
        return int(self._listener.sockets[0].getsockname()[1])

    def forget(self, conn: Connection) -> None:
        self.connections.discard(conn)
        if not self.connections and self._emptied is not None:
            self._emptied.set()

    def stop_listening(self) -> None:
        """No new connection is accepted; the open ones go on."""
        if self._listener is not None:
            self._listener.close()

    async def close(self) -> None:
        if self.closing:
            return
        self.closing = True
        self.stop_listening()
        await self.app.shutdown()
        self._emptied = asyncio.Event()
        for conn in list(self.connections):
            conn.shutdown()
        if self.connections:
            try:
                await asyncio.wait_for(self._emptied.wait(), self.limits.shutdown_grace_s)
            except TimeoutError:
                for conn in list(self.connections):
                    conn.abort()
        await self.app.cleanup()
