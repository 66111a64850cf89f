"""A read's drain over a real Unix socket (`controlplane/drain.py`): the data plane writes every
report it held back ahead of the Ack, so a drain returns holding the rows finished and the starts
held before it; concurrent reads share rounds; a data plane that does not answer holds no read
past the deadline; no data plane, no wait."""

from __future__ import annotations

import asyncio
import importlib
import os
import pkgutil

import msgspec

import controlplane.http
from controlplane.drain import ReportDrain
from dataplane.rpc_client import ControlLink
from shared.rpc import Connection
from shared.wire import (
    PROTOCOL_VERSION,
    Ack,
    AttemptFinished,
    AttemptStarted,
    Drain,
    Hello,
    Message,
    Snapshot,
    Welcome,
)
from tests.integration.test_rpc_rows import ROW, linked_to, row, socket_path  # noqa: F401  (a fixture)
from tests.integration.test_rpc_rows import Control as RowsControl
from tests.support.waits import until


class Control(RowsControl):
    """Control's link and drain, recording what the data plane reports (and acknowledging rows)."""

    def __init__(self, socket_path: str, deadline_s: float = 0.25) -> None:
        super().__init__(socket_path)
        self.settles = 0
        self.settling = asyncio.Event()  # a round's settle waits for it (a test holds a round in flight)
        self.settling.set()
        self.drain = ReportDrain(self.link, self.settled, deadline_s)

    async def settled(self) -> None:
        await self.settling.wait()
        self.settles += 1

    def ids(self, kind: type) -> list[str]:
        return [m.row.attempt_id for m in self.received if isinstance(m, kind)]


async def linked(socket_path: str) -> tuple[Control, ControlLink, asyncio.Task[None]]:
    return await linked_to(Control(socket_path))


async def test_a_drain_returns_holding_every_lazy_row_and_held_start_before_it(socket_path: str) -> None:
    control, client, task = await linked(socket_path)
    try:
        for n in range(20):
            client.finished(row(2 * n))  # a 2xx row: lazy, it may wait the window for company
            client.started(msgspec.structs.replace(ROW, attempt_id=f"att_{2 * n + 1}"), hold=True)
            assert await control.drain.drain()
            assert f"att_{2 * n}" in control.ids(AttemptFinished)
            assert f"att_{2 * n + 1}" in control.ids(AttemptStarted)  # announced, not held
            client.finished(row(2 * n + 1))
        assert control.drain.rounds == 20 and control.drain.late == 0 and control.settles == 20
    finally:
        client.stop()
        task.cancel()
        control.server.close()


async def test_concurrent_reads_share_rounds_and_a_read_never_takes_a_round_begun_before_it(
    socket_path: str,
) -> None:
    control, client, task = await linked(socket_path)
    try:
        control.settling.clear()  # the first round stays in flight until the readers came
        first = asyncio.ensure_future(control.drain.drain())
        await until(lambda: control.drain.rounds == 1, 5, "the first round's Drain is queued")
        client.finished(row(1))  # finished after that round began: only a later round must hold it
        readers = [asyncio.ensure_future(control.drain.drain()) for _ in range(50)]
        await until(lambda: control.drain._next is not None, 5, "the readers queued the next round")
        assert control.drain.rounds == 1 and not any(r.done() for r in readers)
        control.settling.set()
        results = await asyncio.gather(first, *readers)
        assert all(results)
        assert control.drain.rounds == 2  # 51 reads, two round trips
        assert "att_1" in control.ids(AttemptFinished)
        # once nothing is in flight, the next read starts its own round at once
        assert await control.drain.drain() and control.drain.rounds == 3
    finally:
        client.stop()
        task.cancel()
        control.server.close()


async def test_a_data_plane_that_does_not_answer_holds_no_read_past_the_deadline(socket_path: str) -> None:
    """A peer that handshakes and acknowledges the snapshot but never answers a Drain."""
    control = await Control(socket_path, deadline_s=0.1).start()
    reader, writer = await asyncio.open_unix_connection(socket_path)
    conn = Connection(reader, writer, "control")
    drains: list[Drain] = []

    async def on_message(peer: Connection, message: Message) -> None:
        if isinstance(message, Snapshot):
            peer.send_nowait(Ack(req_id=message.req_id))
        elif isinstance(message, Drain):
            drains.append(message)  # and no Ack

    try:
        await conn.send(Hello(version=PROTOCOL_VERSION, role="dataplane", pid=os.getpid()))
        assert isinstance(await conn.read_message(), Welcome)
        runner = asyncio.ensure_future(conn.run(on_message))
        await until(lambda: control.link.ready.is_set(), 5, "control has the link")
        loop = asyncio.get_running_loop()
        began = loop.time()
        assert not await control.drain.drain()
        assert loop.time() - began < 5  # bounded by the deadline (0.1 s), with room for a loaded host
        assert (control.drain.rounds, control.drain.late, len(drains)) == (1, 1, 1)
        assert control.link.connected  # a slow answer to a read does not cost the data plane its link
        runner.cancel()
    finally:
        conn.close()
        control.server.close()


async def test_no_data_plane_linked_no_wait(socket_path: str) -> None:
    control = await Control(socket_path).start()
    try:
        assert await control.drain.drain()
        assert control.drain.rounds == 0
    finally:
        control.server.close()


# Every handler of the control app, and whether its answer drains first: every authenticated one
# but the event feed (a stream) and the scrape; no public one.
NOT_DRAINED = {"events.events", "metrics.metrics", "views.healthz", "dashboard.page", "dashboard.asset"}


def test_every_authenticated_route_drains_but_the_feed_and_the_scrape() -> None:
    handlers = {
        f"{info.name}.{name}": value
        for info in pkgutil.iter_modules(controlplane.http.__path__)
        for name, value in vars(importlib.import_module(f"controlplane.http.{info.name}")).items()
        if hasattr(value, "__leasehold_scope__")
    }
    assert len(handlers) > 25 and NOT_DRAINED <= set(handlers)
    for name, handler in handlers.items():
        assert handler.__leasehold_drains__ is (name not in NOT_DRAINED), name
