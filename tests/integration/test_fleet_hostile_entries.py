"""A Redis writer without the fleet secret (SPEC §19), over a real redis-server: what it puts in the
revoke stream, the acknowledgements and the events channel is skipped, logged once and counted
by kind; the loops that read it go on and serve the next real entry. A forged circuit is read
open, never closed."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import msgspec
import pytest

from controlplane.circuits import CircuitRegistry
from controlplane.core import circuit as rules
from controlplane.events import EventKind
from controlplane.fleet.circuits import RedisCircuits, encode_circuit
from controlplane.fleet.events import FleetEvent, FleetEvents, FleetRevocations, RevokeRequest
from shared.clock import iso_ms, now_ms
from shared.codes import CircuitPhase, Condition
from shared.fleet.entries import EntryKind, FleetEntries
from shared.fleet.secret import FleetSecret, Keyring
from tests.support.fleet import Fleet
from tests.support.rows import row
from tests.support.waits import until as wait_until_async


@pytest.fixture
async def tasks() -> AsyncIterator[list[asyncio.Task]]:
    made: list[asyncio.Task] = []
    yield made
    for task in made:
        task.cancel()
    if made:
        _done, pending = await asyncio.wait(made, timeout=10)
        assert not pending, pending


def outsider(fleet: Fleet) -> FleetEntries:
    """MACs made with a secret the fleet does not hold (a writer guessing)."""
    return FleetEntries(Keyring(FleetSecret(secrets.token_bytes(32)), fleet.keys.fleet_id))


def hostile_requests(fleet: Fleet) -> list[dict[str, bytes | str]]:
    forged = outsider(fleet).mac(EntryKind.REVOKE, ["rv-" + "0" * 16, "acct", "gw-x"])
    return [
        {"request_id": "x", "account_id": "y"},  # the crash-loop entry
        {"request_id": b"\xff\xfe", "account_id": "acct", "from_host": "gw-x", "mac": "m"},  # not UTF-8
        {"request_id": "rv-" + "0" * 16, "account_id": "acct", "from_host": "gw-x"},  # no MAC
        {"request_id": "rv-" + "0" * 16, "account_id": "acct", "from_host": "gw-x", "mac": forged},
        {"request_id": "rv-" + "0" * 16, "account_id": "acct", "from_host": "gw-x", "mac": "A" * 43, "x": "1"},
    ]


async def test_garbage_in_the_revoke_stream_is_skipped_and_the_next_request_served(fleet: Fleet, tasks) -> None:
    server = FleetRevocations(fleet.client, fleet.keys, "gw-b", entries=fleet.entries)
    seen: list[RevokeRequest] = []
    ready = asyncio.Event()

    async def handle(request: RevokeRequest) -> int:
        seen.append(request)
        return 1

    tasks.append(asyncio.create_task(server.serve(handle, ready=ready)))
    await asyncio.wait_for(ready.wait(), 10)
    for fields in hostile_requests(fleet):
        fleet.admin().xadd(fleet.keys.revoke, fields)
    requester = FleetRevocations(fleet.client, fleet.keys, "gw-a", entries=fleet.entries, ack_timeout_s=5)
    answer = await requester.request("acct", ["gw-b"])
    assert (answer.acked, answer.missing, answer.revoked) == (("gw-b",), (), 1)
    assert [(r.account_id, r.from_host) for r in seen] == [("acct", "gw-a")]
    assert fleet.entries.rejected[EntryKind.REVOKE] == len(hostile_requests(fleet))
    assert [r.request_id for r in await server.requests_since(0)] == [answer.request_id]  # a restart's read


async def test_a_forged_acknowledgement_does_not_count(fleet: Fleet, tasks) -> None:
    requester = FleetRevocations(fleet.client, fleet.keys, "gw-a", entries=fleet.entries, ack_timeout_s=0.5)
    channel = fleet.admin().pubsub()
    channel.subscribe(fleet.keys.revoke_acked)

    async def forge_acks() -> None:
        forged = outsider(fleet)
        while True:  # every request in the stream gets a forged ack from gw-b, and garbage
            for _entry_id, fields in fleet.admin().xrange(fleet.keys.revoke):
                request_id = fields[b"request_id"].decode()
                tag = forged.mac(EntryKind.REVOKE_ACK, [request_id, "gw-b", 0])
                fleet.admin().hset(
                    fleet.keys.revoke_acks(request_id), mapping={"gw-b": f"0:{tag}", "gw-c": "garbage", "gw-d": "-5:x"}
                )
            await asyncio.sleep(0.05)

    tasks.append(asyncio.create_task(forge_acks()))
    answer = await requester.request("acct", ["gw-b", "gw-c", "gw-d"])
    assert (answer.acked, answer.missing) == ((), ("gw-b", "gw-c", "gw-d"))
    assert fleet.entries.rejected[EntryKind.REVOKE_ACK] >= 3
    channel.close()


async def test_garbage_on_the_events_channel_is_skipped_and_the_next_event_delivered(fleet: Fleet, tasks) -> None:
    listener = FleetEvents(fleet.client, fleet.keys, "gw-b", entries=fleet.entries)
    got: list[FleetEvent] = []
    ready = asyncio.Event()

    async def handle(event: FleetEvent) -> None:
        got.append(event)

    tasks.append(asyncio.create_task(listener.run(handle, ready=ready)))
    await asyncio.wait_for(ready.wait(), 10)
    forged = FleetEvent(kind=EventKind.ACCOUNT_STATE, host_id="gw-x", data={"account_id": "a", "state": "enabled"})
    for message in (
        b"not json",
        b"[1,2]",
        b'{"kind":"account.state","host_id":"gw-x","data":{}}',
        msgspec.json.encode(msgspec.structs.replace(forged, mac="A" * 43)),
        b"\xff" * 10,
    ):
        fleet.admin().publish(fleet.keys.events, message)
    await FleetEvents(fleet.client, fleet.keys, "gw-a", entries=fleet.entries).publish(
        EventKind.ACCOUNT_STATE, {"account_id": "a", "state": "disabled"}
    )
    await wait_until_async(lambda: len(got) == 1, 10, "the real event delivered")
    assert got[0].data == {"account_id": "a", "state": "disabled"} and got[0].host_id == "gw-a"
    await wait_until_async(lambda: fleet.entries.rejected[EntryKind.EVENT] == 5, 5, "five rejections")


async def test_forged_decisions_evidence_and_outcomes_are_not_believed(fleet: Fleet) -> None:
    """A decision (and a qualifying terminal) a writer puts in Redis could authorise a fallback:
    read as absent instead, counted; the real ones still read."""
    from controlplane.core.fallback import Lineage
    from controlplane.decisions import Decision
    from controlplane.fleet.decisions import RedisDecisions
    from controlplane.fleet.signed import encode as _encode
    from shared.codes import Condition, Outcome

    table = RedisDecisions(fleet.client, fleet.keys, entries=fleet.entries)
    real = Decision(
        mint_decision_id="md_real",
        outcome=Outcome.SELECTED,
        lineage=Lineage("d-1", "o/r", "m"),
        at_ms=1,
        key_id="K1",
        account_id="a",
        fallback_position=0,
    )
    await table.record(real)
    await table.add_evidence("md_real", Condition.RATE_LIMITED)
    await table.record(
        Decision(mint_decision_id="md_held", outcome=Outcome.HELD, lineage=Lineage("d-2", "o/r", "m"), at_ms=2)
    )
    forged = msgspec.structs.replace(real, mint_decision_id="md_forged", key_id="K2")
    other = outsider(fleet)
    admin = fleet.admin()
    forged_mac = other.mac(EntryKind.DECISION, ["md_forged", _encode(forged)])
    admin.set(fleet.keys.decision("md_forged"), _encode((forged_mac, _encode(forged))))
    admin.set(fleet.keys.decision_of_key("K2"), "md_forged")
    admin.set(fleet.keys.decision("md_plain"), _encode(forged))  # the format before MACs
    admin.set(fleet.keys.decision("md_garbage"), b"\xc1\xc1")
    admin.rpush(fleet.keys.evidence("md_real"), "server-error", "rate-limited:" + "A" * 43)
    admin.set(fleet.keys.refused("md_forged_refused"), "rejected")
    before = fleet.entries.rejected[EntryKind.DECISION]
    assert await table.get("md_forged") is None and await table.for_key("K2") is None
    assert await table.get("md_plain") is None and await table.get("md_garbage") is None
    assert await table.stored(["md_real", "md_forged"]) == {"md_real": real}
    assert await table.evidence("md_real") == (Condition.RATE_LIMITED,)
    assert await table.refused_outcome("md_forged_refused") is None
    assert await table.refused_outcome("md_held") is Outcome.HELD and await table.get("md_real") == real
    assert fleet.entries.rejected[EntryKind.DECISION] - before == 8  # each read of each, once logged


async def test_a_forged_closed_circuit_over_an_open_one_does_not_admit_a_mint(fleet: Fleet) -> None:
    """A circuit is MAC'd (SPEC §19): a writer puts "closed" over an open circuit, unsigned, signed
    with another secret, or with a real MAC moved from another account. The account is read open
    (never closed nor absent), each read counted; after the cooldown the one probe this host
    admits is written over the forged bytes, signed, and the account recovers by the rules."""
    store = RedisCircuits(fleet.client, fleet.keys, entries=fleet.entries, unverified_open_ms=30_000)
    registry = CircuitRegistry(store, cooldown_s=30)
    now = now_ms()
    failed = msgspec.structs.replace(row(iso_ms(now), account="acct"), condition=Condition.CREDIT_EXHAUSTED)
    await registry.on_row(failed, now)
    assert not await registry.admits("acct", now)
    key = fleet.keys.circuit("acct")
    closed = encode_circuit(rules.CLOSED)
    other = RedisCircuits(fleet.client, fleet.keys, entries=fleet.entries)
    forgeries = [
        closed,  # unsigned
        msgspec.msgpack.encode((outsider(fleet).mac(EntryKind.CIRCUIT, ["acct", closed]), closed)),
        other.signed("acct-2", rules.CLOSED),  # another account's
        msgspec.msgpack.encode(("A" * 43, closed, "extra")),
    ]
    admin = fleet.admin()
    for n, forged in enumerate(forgeries, start=1):
        admin.set(key, forged)
        assert not await registry.claim_probe("acct", f"key_{n}", now + 1)
        assert (await registry.get("acct", now + 1)).phase == CircuitPhase.OPEN
        assert fleet.entries.rejected[EntryKind.CIRCUIT] >= n
        assert admin.get(key) == forged  # nothing this host wrote was believed over it

    # The host's own next write: after the cooldown it admits one probe and signs what it stores.
    later = now_ms() + 31_000
    assert await registry.claim_probe("acct", "key_probe", later)
    assert not await registry.claim_probe("acct", "key_other", later)  # one probe only
    assert admin.get(key) != forgeries[-1]
    before = fleet.entries.rejected[EntryKind.CIRCUIT]
    assert (await registry.get("acct", later)).probe_key == "key_probe"  # read back: it verifies
    assert fleet.entries.rejected[EntryKind.CIRCUIT] == before
