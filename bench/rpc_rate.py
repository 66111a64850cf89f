"""The RPC's messages per second, in process, with `shared.rpc` over a real Unix socket.

Rule: both ends run in one process and one event loop, so each figure is the whole cost of a
message — encode, frame, write, read, decode, dispatch — paid on one core: a floor, not a
ceiling, for two daemons on two cores. Three figures:

- one-way: `AttemptStarted` frames (the data plane's fire-and-forget report) per second;
- round trips: `AttemptFinished` → `Ack` exchanges per second with `in_flight` outstanding
  (how rows flow to control under load);
- sequential round trip latency (one at a time: the §7 evidence wait for a non-2xx answer).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from typing import Any

from bench.stats import summarize_ms
from shared.rpc import Connection, start_unix_server
from shared.wire import Ack, AttemptFinished, AttemptRow, AttemptStarted, Message, Usage

ROW = AttemptRow(
    attempt_id="att_01JBENCH0000000000000000000",
    key_id="01JBENCH0000000000000000001",
    account_id="legacy-anthropic",
    mint_decision_id=None,
    dispatch_id="dispatch-bench",
    repo_slug="bench/run",
    principal_id="bench",
    wire="anthropic",
    path="/v1/messages",
    requested_model="claude-sonnet-4-6",
    served_model="claude-sonnet-4-6",
    stream=True,
    started_at="2026-01-01T00:00:00.000Z",
    finished_at="2026-01-01T00:00:01.000Z",
    status="completed",
    http_status=200,
    condition=None,
    refusal_reason=None,
    usage=Usage(input_tokens=12, output_tokens=44, cache_read_tokens=7, cache_creation_tokens=5),
    cost_usd=None,
    cost_reason=None,
    overhead_ms=0.4,
)


async def _pair(path: str) -> tuple[Any, Connection, list[int], list[asyncio.Task[None]]]:
    """A listening server that acks `AttemptFinished` and counts frames, and a client."""
    counter = [0]
    tasks: list[asyncio.Task[None]] = []

    async def on_message(conn: Connection, message: Message) -> None:
        counter[0] += 1
        if isinstance(message, AttemptFinished):
            conn.send_nowait(Ack(req_id=message.req_id))

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await Connection(reader, writer, "bench-server").run(on_message)

    async def ignore(conn: Connection, message: Message) -> None:
        return None

    server = await start_unix_server(path, on_client)
    reader, writer = await asyncio.open_unix_connection(path)
    client = Connection(reader, writer, "bench-client")
    tasks.append(asyncio.create_task(client.run(ignore)))
    return server, client, counter, tasks


async def measure(duration_s: float = 1.0, in_flight: int = 64, sequential: int = 500) -> dict[str, Any]:
    directory = tempfile.mkdtemp(prefix="lh-rpc-")
    path = os.path.join(directory, "bench.sock")
    server, client, counter, tasks = await _pair(path)
    try:
        # one-way: write in batches, let the writer drain, count what the server decoded
        message = AttemptStarted(row=ROW)
        start, base = time.perf_counter(), counter[0]
        while time.perf_counter() - start < duration_s:
            for _ in range(256):
                client.send_nowait(message)
            await client.writer.drain()
            await asyncio.sleep(0)
        sent_for = time.perf_counter() - start
        one_way = (counter[0] - base) / sent_for

        # round trips with `in_flight` outstanding requests
        done = [0]
        stop_at = time.perf_counter() + duration_s

        async def worker() -> None:
            while time.perf_counter() < stop_at:
                await client.request(lambda rid: AttemptFinished(req_id=rid, row=ROW), 10.0)
                done[0] += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(in_flight)))
        round_trips = done[0] / (time.perf_counter() - t0)

        # one at a time: the latency of a single acknowledged row
        samples: list[float] = []
        for _ in range(sequential):
            t = time.perf_counter()
            await client.request(lambda rid: AttemptFinished(req_id=rid, row=ROW), 10.0)
            samples.append(time.perf_counter() - t)
    finally:
        client.close()
        for task in tasks:
            task.cancel()
        server.close()
        try:
            os.unlink(path)
            os.rmdir(directory)
        except OSError:
            pass
    return {
        "one_way_msgs_per_s": round(one_way),
        "round_trips_per_s": round(round_trips),
        "in_flight": in_flight,
        "sequential_round_trip_ms": summarize_ms(samples),
    }


def run(duration_s: float = 1.0, in_flight: int = 64, sequential: int = 500) -> dict[str, Any]:
    import uvloop

    return uvloop.run(measure(duration_s, in_flight, sequential))
