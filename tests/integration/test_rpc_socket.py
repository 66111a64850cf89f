"""The RPC over a real Unix socket: handshake, acks, pushes, bad frames, socket permissions."""

from __future__ import annotations

import asyncio
import os
import stat
import struct
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from controlplane.replication import DataPlaneLink
from dataplane.leases import LeaseReplica
from dataplane.rpc_client import ControlLink
from shared.rpc import Connection, start_unix_server
from shared.wire import PROTOCOL_VERSION, AccountRoute, Ack, Hello, Lease, Refused, Welcome
from tests.support.waits import until

ROUTE = AccountRoute(
    id="legacy-anthropic",
    provider_binding="anthropic",
    wire="anthropic",
    base_url="http://127.0.0.1:9",
    auth_style="x-api-key",
    credential_env="GATEWAY_X",
)


def lease(n: int) -> Lease:
    return Lease(
        key_id=f"01J000000000000000000000{n:02d}", digest=bytes([n]) * 32, account_id=ROUTE.id, expires_at_ms=2**62
    )


@pytest.fixture
def socket_path(tmp_path: Path) -> str:
    return str(tmp_path / "rt" / "control.sock")


async def serve(socket_path: str, leases: list[Lease]):
    received = []

    async def on_message(conn: Connection, message) -> None:
        received.append(message)

    link = DataPlaneLink()
    link.bind(lambda: (list(leases), [ROUTE], True), on_message, lambda: None)
    server = await start_unix_server(socket_path, link.on_client)
    return link, server, received


async def test_socket_is_private(socket_path: str) -> None:
    _, server, _ = await serve(socket_path, [])
    try:
        assert stat.S_IMODE(os.stat(socket_path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(socket_path)).st_mode) == 0o700
    finally:
        server.close()


async def test_snapshot_push_and_ack_round_trip(socket_path: str) -> None:
    link, server, _ = await serve(socket_path, [lease(1)])
    replica = LeaseReplica(env={})
    client = ControlLink(socket_path, replica)
    task = asyncio.create_task(client.run())
    try:
        await asyncio.wait_for(client.synced.wait(), 5)
        assert len(replica) == 1 and replica.ready
        assert await link.lease_added(lease(2)) is True  # returns only once the data plane has it
        assert len(replica) == 2
        assert await link.leases_removed([lease(1).key_id]) is True
        assert len(replica) == 1
    finally:
        client.stop()
        task.cancel()
        server.close()


async def test_losing_control_clears_the_replica_and_reconnect_resyncs(socket_path: str) -> None:
    link, server, _ = await serve(socket_path, [lease(1)])
    replica = LeaseReplica(env={})
    client = ControlLink(socket_path, replica)
    task = asyncio.create_task(client.run())
    try:
        await asyncio.wait_for(client.synced.wait(), 5)
        with capture_logs() as logs:
            link.conn.close()
            # fail closed at once: every lease dropped (the redial is fast, so read it from the log)
            await until(lambda: any(e["event"] == "control_link_lost" for e in logs), 5, "control_link_lost logged")
            lost = next(e for e in logs if e["event"] == "control_link_lost")
            assert lost["leases_dropped"] == 1
            # redialled and resynchronised from a fresh snapshot
            await until(
                lambda: any(e["event"] == "control_synchronised" for e in logs), 5, "control_synchronised logged"
            )
        assert replica.ready and len(replica) == 1
    finally:
        client.stop()
        task.cancel()
        server.close()


async def test_version_mismatch_is_refused_and_logged(socket_path: str) -> None:
    _, server, _ = await serve(socket_path, [])
    try:
        with capture_logs() as logs:
            reader, writer = await asyncio.open_unix_connection(socket_path)
            conn = Connection(reader, writer, "test")
            await conn.send(Hello(version=999, role="dataplane", pid=1))
            answer = await asyncio.wait_for(conn.read_message(), 5)
            assert isinstance(answer, Refused) and "version" in answer.reason
            conn.close()
            await until(lambda: any(e["event"] == "rpc_peer_refused" for e in logs), 5, "rpc_peer_refused logged")
    finally:
        server.close()


@pytest.mark.parametrize(
    "garbage",
    [struct.pack(">I", 0), struct.pack(">I", 2**31), struct.pack(">I", 3) + b"\xc1\xc1\xc1"],
    ids=["empty", "oversized", "malformed"],
)
async def test_a_bad_frame_closes_that_connection_and_the_server_lives_on(socket_path: str, garbage: bytes) -> None:
    link, server, _ = await serve(socket_path, [])
    try:
        with capture_logs() as logs:
            reader, writer = await asyncio.open_unix_connection(socket_path)
            conn = Connection(reader, writer, "test")
            await conn.send(Hello(version=PROTOCOL_VERSION, role="dataplane", pid=1))
            assert isinstance(await asyncio.wait_for(conn.read_message(), 5), Welcome)
            snapshot = await asyncio.wait_for(conn.read_message(), 5)
            await conn.send(Ack(req_id=snapshot.req_id))
            writer.write(garbage)
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
            await until(lambda: any(e["event"] == "rpc_frame_rejected" for e in logs), 5, "rpc_frame_rejected logged")
            await until(lambda: not link.connected, 5, "control to drop the connection")
        # the daemon still serves a well-behaved peer
        replica = LeaseReplica(env={})
        client = ControlLink(socket_path, replica)
        task = asyncio.create_task(client.run())
        await asyncio.wait_for(client.synced.wait(), 5)
        client.stop()
        task.cancel()
    finally:
        server.close()


async def test_a_second_data_plane_is_refused(socket_path: str) -> None:
    _, server, _ = await serve(socket_path, [])
    first = ControlLink(socket_path, LeaseReplica(env={}))
    task = asyncio.create_task(first.run())
    try:
        await asyncio.wait_for(first.synced.wait(), 5)
        reader, writer = await asyncio.open_unix_connection(socket_path)
        conn = Connection(reader, writer, "second")
        await conn.send(Hello(version=PROTOCOL_VERSION, role="dataplane", pid=2))
        answer = await asyncio.wait_for(conn.read_message(), 5)
        assert isinstance(answer, Refused) and answer.reason == "another-dataplane-connected"
        conn.close()
    finally:
        first.stop()
        task.cancel()
        server.close()
