"""Attempt rows over a real Unix socket: sent without a task or a wait, kept until acknowledged,
re-sent after a reconnect; frames of one loop iteration leave in one write, lazy ones a little
later, in order."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TypeVar

import msgspec
import pytest

from controlplane.replication import DataPlaneLink
from dataplane.leases import LeaseReplica
from dataplane.rpc_client import START_HOLD_S, ControlLink
from shared.rpc import LAZY_FLUSH_S, Connection, encode_frame, start_unix_server
from shared.wire import AccountRoute, Ack, Acks, AttemptFinished, AttemptRow, AttemptStarted, Message
from tests.support.waits import until

ROUTE = AccountRoute(
    id="legacy-anthropic",
    provider_binding="anthropic",
    wire="anthropic",
    base_url="http://127.0.0.1:9",
    auth_style="x-api-key",
    credential_env="GATEWAY_X",
)
ROW = AttemptRow(
    attempt_id="att_1",
    key_id="01J0000000000000000000000A",
    account_id=ROUTE.id,
    mint_decision_id=None,
    dispatch_id=None,
    repo_slug="acme/app",
    principal_id="w",
    wire="anthropic",
    path="/v1/messages",
    requested_model="m",
    served_model=None,
    stream=False,
    started_at="2026-01-01T00:00:00.000Z",
    finished_at=None,
    status=None,
    http_status=None,
    condition=None,
    refusal_reason=None,
    usage=None,
    cost_usd=None,
    cost_reason=None,
    overhead_ms=None,
)


def row(n: int, status: str = "completed", http_status: int = 200) -> AttemptRow:
    return msgspec.structs.replace(
        ROW, attempt_id=f"att_{n}", status=status, http_status=http_status, finished_at="2026-01-01T00:00:01.000Z"
    )


class Control:
    """A control side that records what arrives and acknowledges rows while `acking`."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.received: list[Message] = []
        self.acking = True
        self.link = DataPlaneLink()
        self.link.bind(lambda: ([], [ROUTE], True), self.on_message, lambda: None)
        self.server: asyncio.AbstractServer | None = None

    async def on_message(self, conn: Connection, message: Message) -> None:
        self.received.append(message)
        if isinstance(message, AttemptFinished) and self.acking:
            conn.send_nowait(Ack(req_id=message.req_id))

    async def start(self) -> Control:
        self.server = await start_unix_server(self.socket_path, self.link.on_client)
        return self

    def rows(self) -> list[str]:
        return [m.row.attempt_id for m in self.received if isinstance(m, AttemptFinished)]


@pytest.fixture
def socket_path(tmp_path: Path) -> str:
    return str(tmp_path / "rt" / "control.sock")


C = TypeVar("C", bound=Control)


async def linked_to(control: C) -> tuple[C, ControlLink, asyncio.Task[None]]:
    """`control` listening, a data plane's link to it synchronised, and control holding the link."""
    await control.start()
    client = ControlLink(control.socket_path, LeaseReplica(env={}))
    task = asyncio.create_task(client.run())
    await asyncio.wait_for(client.synced.wait(), 5)
    await until(lambda: control.link.ready.is_set(), 5, "control has the link")
    return control, client, task


async def linked(socket_path: str) -> tuple[Control, ControlLink, asyncio.Task[None]]:
    return await linked_to(Control(socket_path))


async def test_a_2xx_row_is_sent_without_waiting_and_leaves_the_outbox_on_its_ack(socket_path: str) -> None:
    control, client, task = await linked(socket_path)
    try:
        client.started(msgspec.structs.replace(ROW, attempt_id="att_1"))
        assert client.finished(row(1)) is None  # nothing to wait on
        assert list(client.outbox) == ["att_1"]
        await until(lambda: not client.outbox, 5, "every row acknowledged")
        # it ended before its start left (the lazy window): reported once, by its finished row
        assert [type(m) for m in control.received] == [AttemptFinished]
        client.started(msgspec.structs.replace(ROW, attempt_id="att_2"))
        await until(lambda: len(control.received) == 2, 5, "the start of a longer attempt")
        client.finished(row(2))
        await until(lambda: not client.outbox, 5, "every row acknowledged")
        assert [type(m) for m in control.received] == [AttemptFinished, AttemptStarted, AttemptFinished]
    finally:
        client.stop()
        task.cancel()
        control.server.close()


async def test_a_held_start_is_sent_only_for_an_attempt_still_running_after_the_hold(socket_path: str) -> None:
    control, client, task = await linked(socket_path)
    try:
        loop = asyncio.get_running_loop()
        client.started(msgspec.structs.replace(ROW, attempt_id="att_1"), hold=True)
        client.started(msgspec.structs.replace(ROW, attempt_id="att_2"), hold=True)
        held_at = loop.time()
        client.finished(row(1))  # ends within the hold: reported once
        await until(lambda: len(control.received) == 2, 5, "the finished row and the held start")
        assert [(type(m), m.row.attempt_id) for m in control.received] == [
            (AttemptFinished, "att_1"),
            (AttemptStarted, "att_2"),
        ]
        assert loop.time() - held_at >= START_HOLD_S  # not before the hold
        client.finished(row(2))
        await until(lambda: not client.outbox, 5, "every row acknowledged")
        assert control.rows() == ["att_1", "att_2"]
        assert [type(m) for m in control.received].count(AttemptStarted) == 1
    finally:
        client.stop()
        task.cancel()
        control.server.close()


async def test_held_starts_are_announced_by_the_resync_after_a_lost_link(socket_path: str) -> None:
    control, client, task = await linked(socket_path)
    try:
        client.started(msgspec.structs.replace(ROW, attempt_id="att_7"), hold=True)
        control.link.conn.close()  # the link drops while the start is held
        await until(
            lambda: [m.row.attempt_id for m in control.received if isinstance(m, AttemptStarted)] == ["att_7"],
            5,
            "the held start announced once, by the resync",
        )
        client.finished(row(7))
        await until(lambda: control.rows() == ["att_7"], 5, "its row")
        assert [m.row.attempt_id for m in control.received if isinstance(m, AttemptStarted)] == ["att_7"]
    finally:
        client.stop()
        task.cancel()
        control.server.close()


async def test_a_waited_row_resolves_true_on_its_ack_and_false_without_a_link(socket_path: str) -> None:
    control, client, task = await linked(socket_path)
    try:
        held = client.finished(row(2, "upstream_error", 500), wait=True)
        assert await asyncio.wait_for(held, 5) is True
        assert control.rows() == ["att_2"] and not client.outbox
    finally:
        client.stop()
        task.cancel()
        control.server.close()
    alone = ControlLink(socket_path + ".none", LeaseReplica(env={}))
    future = alone.finished(row(3, "upstream_error", 500), wait=True)
    assert future.done() and future.result() is False
    assert list(alone.outbox) == ["att_3"]  # kept for the next link


async def test_unacknowledged_rows_are_resent_after_a_reconnect(socket_path: str) -> None:
    control, client, task = await linked(socket_path)
    try:
        control.acking = False
        for n in range(5):
            client.finished(row(n))
        await until(lambda: len(control.rows()) == 5, 5, "five rows at control")
        assert len(client.outbox) == 5  # sent, never acknowledged
        control.acking = True
        control.link.conn.close()  # control goes away; the data plane redials and resyncs
        await until(lambda: not client.outbox, 5, "every row acknowledged")
        assert sorted(control.rows()) == sorted([f"att_{n}" for n in range(5)] * 2)  # each re-sent once
    finally:
        client.stop()
        task.cancel()
        control.server.close()


async def test_shutdown_flush_waits_for_every_row(socket_path: str) -> None:
    control, client, task = await linked(socket_path)
    try:
        for n in range(20):
            client.finished(row(n))
        assert await client.flush(5.0) == 0
        assert len(control.rows()) == 20
    finally:
        client.stop()
        task.cancel()
        control.server.close()


class CountingTransport:
    """The real transport, with its `write` calls counted (`Connection` writes to it directly)."""

    def __init__(self, transport: asyncio.WriteTransport, counter: CountingWriter) -> None:
        self.inner = transport
        self.counter = counter

    def write(self, data: bytes) -> None:
        self.counter.writes += 1
        self.inner.write(data)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


class CountingWriter:
    """The real StreamWriter, with its `write` calls counted, at the writer or its transport."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.inner = writer
        self.writes = 0
        self.transport = CountingTransport(writer.transport, self)  # type: ignore[arg-type]

    def write(self, data: bytes) -> None:
        self.writes += 1
        self.inner.write(data)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


async def test_frames_of_one_iteration_leave_in_one_write_and_lazy_ones_wait(socket_path: str) -> None:
    got: list[Message] = []

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def handler(_conn: Connection, message: Message) -> None:
            got.append(message)

        await Connection(reader, writer, "peer").run(handler)

    server = await start_unix_server(socket_path, on_client)
    reader, writer = await asyncio.open_unix_connection(socket_path)
    counting = CountingWriter(writer)
    conn = Connection(reader, counting, "test")  # type: ignore[arg-type]
    try:
        for n in range(3):
            conn.send_nowait(AttemptStarted(row=row(n)))
        assert counting.writes == 0
        await until(lambda: len(got) == 3, 5, "three frames")
        assert counting.writes == 1

        loop = asyncio.get_running_loop()
        sent_at = loop.time()
        conn.send_nowait(AttemptStarted(row=row(10)), lazy=True)
        conn.send_nowait(AttemptStarted(row=row(11)), lazy=True)
        await until(lambda: len(got) == 5, 5, "five frames")
        assert loop.time() - sent_at >= LAZY_FLUSH_S * 0.9  # waited for company
        assert counting.writes == 2

        conn.send_nowait(AttemptStarted(row=row(20)), lazy=True)
        conn.send_nowait(AttemptStarted(row=row(21)))  # an eager frame takes the lazy one along
        await until(lambda: len(got) == 7, 5, "seven frames")
        assert counting.writes == 3
        assert [m.row.attempt_id for m in got] == [f"att_{n}" for n in (0, 1, 2, 10, 11, 20, 21)]

        conn.send_withdrawable("att_30", AttemptStarted(row=row(30)))
        conn.send_withdrawable("att_31", AttemptStarted(row=row(31)))
        assert conn.withdraw("att_30") and not conn.withdraw("att_30")
        conn.send_nowait(AttemptStarted(row=row(32)), lazy=True)
        await until(lambda: len(got) == 9, 5, "nine frames")
        assert not conn.withdraw("att_31")  # it left: too late to take back
        assert [m.row.attempt_id for m in got[7:]] == ["att_31", "att_32"]  # in order, 30 withdrawn
    finally:
        conn.close()
        server.close()


async def test_one_acks_frame_acknowledges_a_settles_rows(socket_path: str) -> None:
    """Control acknowledges one settle's rows in one `Acks` frame; each row's callback gets its
    own `Ack` with the frame's `ok`."""
    seen: list[int] = []

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def handler(conn: Connection, message: Message) -> None:
            assert isinstance(message, AttemptFinished)
            seen.append(message.req_id)
            if len(seen) == 3:
                conn.send_nowait(Acks(req_ids=list(seen), ok=False))

        await Connection(reader, writer, "peer").run(handler)

    server = await start_unix_server(socket_path, on_client)
    reader, writer = await asyncio.open_unix_connection(socket_path)
    conn = Connection(reader, writer, "test")
    reading = asyncio.create_task(conn.run(lambda _c, _m: asyncio.sleep(0)))
    acks: list[Ack | None] = []
    try:
        for n in range(3):
            conn.post(lambda rid, n=n: AttemptFinished(req_id=rid, row=row(n)), acks.append)
        await until(lambda: len(acks) == 3, 5, "three acks from one frame")
        assert [(a.req_id, a.ok) for a in acks if a is not None] == [(rid, False) for rid in seen]
    finally:
        conn.close()
        reading.cancel()
        server.close()


async def test_a_plain_function_takes_each_push_in_order(socket_path: str) -> None:
    """Control's link takes each report with a plain function (`ControlService.handle`): no
    coroutine per frame, and the pushes still arrive whole and in order."""
    got: list[Message] = []

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await Connection(reader, writer, "peer").run(lambda _conn, message: got.append(message))

    server = await start_unix_server(socket_path, on_client)
    reader, writer = await asyncio.open_unix_connection(socket_path)
    conn = Connection(reader, writer, "test")
    try:
        for n in range(40):
            conn.send_nowait(AttemptStarted(row=row(n)), lazy=n % 2 == 0)
        await until(lambda: len(got) == 40, 5, "forty frames")
        assert [m.row.attempt_id for m in got] == [f"att_{n}" for n in range(40)]  # type: ignore[attr-defined]
    finally:
        conn.close()
        server.close()


async def test_frames_sent_by_read_done_are_written_in_the_readers_turn(socket_path: str) -> None:
    """What `read_done` sends (control's Acks) is written when it returns, in the reader's turn
    (before a callback it scheduled first), in one write with a lazy frame queued before it."""
    got: list[Message] = []
    after_read_done: list[bool] = []
    next_turn: list[int] = []

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counting = CountingWriter(writer)
        peer = Connection(reader, counting, "peer")  # type: ignore[arg-type]
        pushed: list[Message] = []

        def read_done() -> None:
            if pushed:
                peer.send_nowait(AttemptStarted(row=row(99)), lazy=True)
                for message in pushed:
                    peer.send_nowait(Ack(req_id=message.req_id))  # type: ignore[attr-defined]
                pushed.clear()

        def handler(_conn: Connection, message: Message) -> None:
            pushed.append(message)

        def read_done_checked() -> None:
            before = counting.writes
            asyncio.get_running_loop().call_soon(lambda: next_turn.append(counting.writes - before))
            read_done()
            after_read_done.append(counting.writes == before)  # not yet: after it returns

        await peer.run(handler, read_done_checked)

    server = await start_unix_server(socket_path, on_client)
    reader, writer = await asyncio.open_unix_connection(socket_path)
    conn = Connection(reader, writer, "test")
    reading = asyncio.create_task(conn.run(lambda _c, message: got.append(message)))
    acks: list[Ack | None] = []
    try:
        for n in range(2):
            conn.post(lambda rid, n=n: AttemptFinished(req_id=rid, row=row(n)), acks.append)
        await until(lambda: len(acks) == 2 and len(got) == 1, 5, "two acks and the lazy frame")
        assert all(a is not None and a.ok for a in acks)
        assert [m.row.attempt_id for m in got] == ["att_99"]  # type: ignore[attr-defined]
        assert after_read_done and all(after_read_done)
        assert next_turn and next_turn[0] == 1  # written once, before the next turn's callbacks
    finally:
        conn.close()
        reading.cancel()
        server.close()


async def test_read_done_follows_each_read_and_a_read_a_bad_frame_cut_short(socket_path: str) -> None:
    """`read_done` (control settles there) is called after the pushes of each read were handled,
    and once more when a bad frame ends the connection: what the read handled before it is
    settled too."""
    events: list[str] = []

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await Connection(reader, writer, "peer").run(
            lambda _conn, message: events.append(message.row.attempt_id),  # type: ignore[attr-defined]
            lambda: events.append("done"),
        )

    server = await start_unix_server(socket_path, on_client)
    reader, writer = await asyncio.open_unix_connection(socket_path)
    try:

        def done_after(attempt_id: str) -> bool:
            return attempt_id in events and "done" in events[events.index(attempt_id) :]

        writer.write(encode_frame(AttemptStarted(row=row(1))) + encode_frame(AttemptStarted(row=row(2))))
        await until(lambda: done_after("att_2"), 5, "the first read, then read_done")
        writer.write(encode_frame(AttemptStarted(row=row(3))) + b"\x00\x00\x00\x03\xc1\xc1\xc1")  # then a bad frame
        await until(lambda: done_after("att_3"), 5, "the cut read, then read_done")
        assert [e for e in events if e != "done"] == ["att_1", "att_2", "att_3"]
    finally:
        writer.close()
        server.close()
