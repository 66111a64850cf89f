"""What a connection (`protocol.Connection`) needs of its server (`server.Server`), and what
answering a request (`answer.py`) needs of its connection: protocols, so neither module
imports the other's."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from shared.http1.errors import Refused

if TYPE_CHECKING:
    from shared.http1.app import Application
    from shared.http1.headers import DateValue
    from shared.http1.limits import Limits
    from shared.http1.request import Request


class Host(Protocol):
    """What a connection needs of its server (`shared.http1.server.Server`)."""

    app: Application
    limits: Limits
    date: DateValue
    refused: Counter[Refused]
    connections: set[Any]  # the open `Connection`s
    closing: bool
    handler_cancellation: bool
    hand_off: Callable[[Any, Request, bytes], None] | None  # (a `Connection`, its request, the tail)
    over_cap: Callable[[], bytes] | None

    def forget(self, conn: Any) -> None: ...


class Conn(Protocol):
    """What answering a request needs of its connection (`protocol.Connection`)."""

    server: Host
    app: Application
    limits: Limits

    @property
    def reading_stopped(self) -> bool: ...

    def pause_reading(self, why: str) -> None: ...
    def resume_reading(self, why: str) -> None: ...
    def send_continue(self) -> None: ...
