"""Redis unreachable, hung or restarted: every backend answers `StateUnavailable` within its
bound, never a guess, and the same clients recover once Redis is back (SPEC §16).

Each test starts a redis-server of its own (it is stopped, paused with SIGSTOP or restarted).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controlplane.core import circuit as rules
from controlplane.events import EventKind
from controlplane.fleet.circuits import RedisCircuits
from controlplane.fleet.decisions import RedisDecisions
from controlplane.fleet.events import FleetEvents, FleetRevocations
from shared.capacity import StateUnavailable
from shared.chainfile import HashChain
from shared.fleet.capacity import RedisCapacity
from shared.fleet.chains import RedisChainStorage
from shared.fleet.hosts import HostRegistry
from shared.fleet.keys import Ceiling
from tests.support.fleet import Fleet
from tests.support.redis_server import RedisServer
from tests.support.waits import until as wait_until_async

TIMEOUT_S = 0.5
# A hung server is noticed within one reply timeout; a fresh connection's own handshake can
# take a second one. The rest is a loaded 2-core machine's scheduling slack.
HUNG_BOUND_S = 2 * TIMEOUT_S + 1.0


@dataclass
class Backends:
    fleet: Fleet
    capacity: RedisCapacity
    circuits: RedisCircuits
    decisions: RedisDecisions
    hosts: HostRegistry
    chain: RedisChainStorage
    events: FleetEvents
    revocations: FleetRevocations


@pytest.fixture
async def backends(tmp_path: Path) -> AsyncIterator[tuple[RedisServer, Backends]]:
    server = RedisServer(tmp_path / "redis").start()
    fleet = Fleet(server, timeout_s=TIMEOUT_S)
    c, k = fleet.client, fleet.keys
    made = Backends(
        fleet,
        RedisCapacity(c, k, Ceiling.LEASE, "gw-1"),
        RedisCircuits(c, k, entries=fleet.entries),
        RedisDecisions(c, k, entries=fleet.entries),
        HostRegistry(c, k, ttl_s=10),
        RedisChainStorage(fleet.sync, k, "policy"),
        FleetEvents(c, k, "gw-1", entries=fleet.entries),
        FleetRevocations(c, k, "gw-1", ack_timeout_s=0.2, entries=fleet.entries),
    )
    try:
        yield server, made
    finally:
        if not server.alive:
            server.start()  # so the namespace is cleaned like any other
        await fleet.close()
        server.stop()


def _chain_commit(b: Backends) -> Any:
    return HashChain("policy", "policy.anchor", lambda records: len(records), storage=b.chain).commit(
        lambda check: {"action": "test"}
    )


# Every call of every backend, each one expected to raise StateUnavailable while Redis is gone.
CALLS: list[tuple[str, Callable[[Backends], Awaitable[Any] | Any]]] = [
    ("capacity.reserve", lambda b: b.capacity.reserve("a", "h", 1)),
    ("capacity.release", lambda b: b.capacity.release("h")),
    ("capacity.holds", lambda b: b.capacity.holds("h")),
    ("capacity.count", lambda b: b.capacity.count("a")),
    ("capacity.counts_by_host", lambda b: b.capacity.counts_by_host("a")),
    ("capacity.release_host", lambda b: b.capacity.release_host("gw-2")),
    ("capacity.reregister", lambda b: b.capacity.reregister([("a", "h", 1)])),
    ("circuits.load", lambda b: b.circuits.load("a")),
    ("circuits.swap", lambda b: b.circuits.swap("a", rules.CLOSED, rules.Circuit(consecutive=1))),
    ("decisions.get", lambda b: b.decisions.get("md_1")),
    ("decisions.claim_live", lambda b: b.decisions.claim_live("k", "r", "d")),
    ("decisions.add_evidence", lambda b: b.decisions.add_evidence("md_1", None)),
    ("hosts.claim", lambda b: b.hosts.claim("gw-1", "inst-1")),
    ("hosts.heartbeat", lambda b: b.hosts.heartbeat("gw-1", "inst-1", 0, "inc")),
    ("hosts.reap_dead", lambda b: b.hosts.reap_dead()),
    ("events.publish", lambda b: b.events.publish(EventKind.POLICY, {"revision": 1})),
    ("revocations.request", lambda b: b.revocations.request("a", ["gw-1"])),
    ("chain.read", lambda b: b.chain.read()),
    ("chain.version", lambda b: b.chain.version()),
    ("chain.commit", _chain_commit),
    ("hashchain.read", lambda b: HashChain("policy", "policy.anchor", list, storage=b.chain).read()),
]


async def _call(b: Backends, call: Callable[[Backends], Any]) -> Any:
    result = call(b)
    return await result if isinstance(result, Awaitable) else result


async def _warm(b: Backends) -> None:
    """Use every backend once, so the pools hold connections the outage then breaks."""
    for _name, call in CALLS:
        try:
            await _call(b, call)
        except Exception:
            pass


@pytest.mark.parametrize("name,call", CALLS, ids=[c[0] for c in CALLS])
async def test_an_unreachable_redis_is_state_unavailable(backends, name: str, call) -> None:
    server, b = backends
    await _warm(b)
    server.stop()
    started = time.monotonic()
    with pytest.raises(StateUnavailable):
        await _call(b, call)
    assert time.monotonic() - started < HUNG_BOUND_S


@pytest.mark.parametrize("name,call", CALLS, ids=[c[0] for c in CALLS])
async def test_a_hung_redis_is_state_unavailable_within_the_timeout(backends, name: str, call) -> None:
    """SIGSTOP: connections stay open and nothing answers. Each call gives up within its bound,
    and after SIGCONT the same client answers again."""
    server, b = backends
    await _warm(b)
    server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(StateUnavailable):
            await _call(b, call)
        assert time.monotonic() - started < HUNG_BOUND_S
    finally:
        server.resume()

    async def answers() -> bool:
        return await b.capacity.count("a") >= 0

    await wait_until_async(answers, 10, "the same client to answer after SIGCONT")


async def test_the_same_clients_recover_after_a_restart(backends) -> None:
    server, b = backends
    assert await b.capacity.reserve("a", "h1", 2)
    assert b.chain.version()
    server.restart()  # same port, nothing kept

    async def answers() -> bool:
        return await b.capacity.count("a") == 0  # the data is gone; the client is not

    await wait_until_async(answers, 10, "the same asyncio client after a restart")
    assert await b.capacity.reserve("a", "h2", 2)  # scripts reloaded by the client (NOSCRIPT)
    assert await b.circuits.swap("a", rules.CLOSED, rules.Circuit(consecutive=1))
    assert b.chain.read().data == b"" and _chain_commit(b).revision == 1  # the blocking client too


async def test_an_error_reply_is_state_unavailable(backends) -> None:
    """Redis answering an error (here: out of memory, writes refused) is unavailable too."""
    server, b = backends
    admin = b.fleet.admin()
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", "1")
    try:
        with pytest.raises(StateUnavailable):
            await b.capacity.reserve("a", "h", 1)
        with pytest.raises(StateUnavailable):
            _chain_commit(b)
        assert await b.capacity.count("a") == 0  # reads still answer
    finally:
        admin.config_set("maxmemory", "0")
    assert await b.capacity.reserve("a", "h", 1)
