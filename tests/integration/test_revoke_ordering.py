"""A revoke never overtakes its key's rows (SPEC §3), deterministically, over the real socket:
the real control service and the real data-plane link, in one loop.

The data plane finishes a half-open circuit's probe (a 2xx row, sent lazily, nobody waits for
it) and control revokes the probe's key in the same breath, before the row could have reached
it — the race the system test (`tests/system/test_revoke_ordering.py`) runs in a loop. The data
plane acknowledges the `LeaseRemoved` only after that row, on the same connection; control
lets the probe go only once the removal is acknowledged. So when the revoke returns control
holds the row, and the probe's success has closed the circuit.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from controlplane.service import ControlService
from dataplane.leases import LeaseReplica
from dataplane.rpc_client import ControlLink
from shared.clock import now_ms
from shared.codes import CircuitPhase
from shared.rpc import Connection, start_unix_server
from shared.tokens import new_token
from shared.wire import AttemptFinished, AttemptRow, Lease, Message
from tests.support.control import make_control
from tests.support.waits import until

ACCOUNT = "legacy-anthropic"


def _service(tmp: Path) -> ControlService:
    return make_control(
        tmp,
        settings={"GATEWAY_RUNTIME_DIR": str(tmp / "rt"), "GATEWAY_CIRCUIT_COOLDOWN_SECONDS": "1"},
        env={"GATEWAY_ANTHROPIC_API_KEY": "x"},
    ).service


def _row(n: int, key_id: str, http_status: int) -> AttemptRow:
    return AttemptRow(
        attempt_id=f"att_{n:04d}",
        key_id=key_id,
        account_id=ACCOUNT,
        mint_decision_id=None,
        dispatch_id=None,
        repo_slug="acme/app",
        principal_id="w",
        wire="anthropic",
        path="/v1/messages",
        requested_model="claude-sonnet-4-6",
        served_model=None,
        stream=False,
        started_at="2026-11-30T12:00:00.000Z",
        finished_at="2026-11-30T12:00:00.010Z",
        status="completed" if http_status < 300 else "upstream-error",
        http_status=http_status,
        condition=None if http_status < 300 else "overloaded",
        refusal_reason=None,
        usage=None,
        cost_usd=None,
        cost_reason=None,
        overhead_ms=0.1,
    )


async def _grant(service: ControlService) -> Lease:
    token, key_id, digest = new_token()
    lease = Lease(key_id=key_id, digest=digest, account_id=ACCOUNT, expires_at_ms=now_ms() + 600_000)
    account = service.registry.get(ACCOUNT)
    assert await service.lease_capacity.reserve(ACCOUNT, key_id, None)
    assert await service.circuits.claim_probe(ACCOUNT, key_id, now_ms())  # as the v2 mint does
    await service.grants.grant(lease, account, token)
    return lease


async def test_a_probe_row_finished_just_before_its_revoke_closes_the_circuit(tmp_path: Path) -> None:
    service = _service(tmp_path)
    seen: list[str] = []
    receive = service.on_message

    async def on_message(conn: Connection, message: Message) -> None:  # records the order of arrival
        if isinstance(message, AttemptFinished):
            seen.append(message.row.attempt_id)
        await receive(conn, message)

    service.link._on_message = on_message
    server = await start_unix_server(service.settings.rpc_socket, service.link.on_client)
    dataplane = ControlLink(service.settings.rpc_socket, LeaseReplica(env={}))
    task = asyncio.create_task(dataplane.run())
    try:
        await asyncio.wait_for(dataplane.synced.wait(), 5)
        await asyncio.wait_for(service.link.ready.wait(), 5)
        opener = await _grant(service)
        for n in range(3):  # three qualifying terminals open the circuit
            assert await asyncio.wait_for(dataplane.finished(_row(n, opener.key_id, 529), wait=True), 5)
        assert (await service.circuits.get(ACCOUNT, now_ms())).phase == CircuitPhase.OPEN
        assert await service.revoke(opener.key_id)

        async def half_open() -> bool:
            return (await service.circuits.get(ACCOUNT, now_ms())).phase == CircuitPhase.HALF_OPEN

        await until(half_open, 10, "the circuit half-open")

        probe = await _grant(service)
        assert (await service.circuits.get(ACCOUNT, now_ms())).probe_key == probe.key_id
        dataplane.finished(_row(9, probe.key_id, 200))  # lazily: nobody waits for a 2xx row
        assert await service.revoke(probe.key_id)  # at once, as a worker does

        assert seen[-1] == "att_0009" and service.ledger.has("att_0009")  # control holds the row
        state = await service.circuits.get(ACCOUNT, now_ms())
        assert state.phase == CircuitPhase.CLOSED, state
        assert await service.circuits.admits(ACCOUNT, now_ms())  # the next mint is no second probe
    finally:
        dataplane.stop()
        task.cancel()
        server.close()


async def test_the_data_plane_sends_a_keys_rows_ahead_of_its_removal_ack(tmp_path: Path) -> None:
    """The data plane's half: rows of the removed key still in its outbox (queued lazily, their
    Ack not in) leave ahead of the removal's Ack, so control has read them when it returns."""
    service = _service(tmp_path)
    arrived: list[str] = []
    receive = service.on_message

    async def on_message(conn: Connection, message: Message) -> None:
        if isinstance(message, AttemptFinished):
            arrived.append(message.row.attempt_id)
        await receive(conn, message)

    service.link._on_message = on_message
    server = await start_unix_server(service.settings.rpc_socket, service.link.on_client)
    dataplane = ControlLink(service.settings.rpc_socket, LeaseReplica(env={}))
    task = asyncio.create_task(dataplane.run())
    try:
        await asyncio.wait_for(dataplane.synced.wait(), 5)
        await asyncio.wait_for(service.link.ready.wait(), 5)
        lease = await _grant(service)
        other = await _grant(service)
        dataplane.finished(_row(1, lease.key_id, 200))
        dataplane.finished(_row(2, other.key_id, 200))
        dataplane.finished(_row(3, lease.key_id, 200))
        assert await service.link.leases_removed([lease.key_id])  # returns on the data plane's Ack
        assert {"att_0001", "att_0003"} <= set(arrived)  # both rows of the key were read before it
    finally:
        dataplane.stop()
        task.cancel()
        server.close()
