"""The host registry and membership over a real redis-server: claims, standings, the reaper.

Times are Redis's own (the registry's scripts read `TIME`); every wait is on a condition with a
deadline. TTLs are short here (1 s) so the reaper's bound is measured in test time.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from shared.fleet.capacity import RedisCapacity
from shared.fleet.hosts import HostClaim, HostRegistry, Reaped, Standing, new_instance_id
from shared.fleet.keys import Ceiling
from shared.fleet.membership import HostIdTaken, Membership
from tests.support.fleet import Fleet
from tests.support.redis_server import RedisServer
from tests.support.waits import until as wait_until_async

TTL_S = 1.0


def _redis_ms(fleet: Fleet) -> int:
    seconds, micros = fleet.admin().time()
    return seconds * 1000 + micros // 1000


async def test_a_live_host_id_is_refused_to_a_second_instance(fleet: Fleet) -> None:
    registry = HostRegistry(fleet.client, fleet.keys, ttl_s=10)
    first, second = new_instance_id(), new_instance_id()
    assert (await registry.claim("gw-1", first)).granted
    refused = await registry.claim("gw-1", second)
    assert not refused.granted and 0 < refused.retry_after_ms <= 10_000
    assert (await registry.claim("gw-1", first)).granted  # the holder itself may claim again
    assert (await registry.claim("gw-2", second)).granted  # another id is another host
    with pytest.raises(HostIdTaken):
        await Membership(registry, "gw-1", recover=_never).join(wait=False)


async def test_a_clean_stop_frees_the_id_at_once(fleet: Fleet) -> None:
    registry = HostRegistry(fleet.client, fleet.keys, ttl_s=10)
    first, second = new_instance_id(), new_instance_id()
    await registry.claim("gw-1", first)
    assert not await registry.release("gw-1", second)  # only the holder lets go
    assert await registry.release("gw-1", first)
    assert (await registry.claim("gw-1", second)).granted


async def test_a_crashed_instances_id_is_free_once_its_heartbeat_expired(fleet: Fleet) -> None:
    registry = HostRegistry(fleet.client, fleet.keys, ttl_s=TTL_S)
    await registry.claim("gw-1", new_instance_id())  # then never beats again: crashed
    started = time.monotonic()
    successor = new_instance_id()

    async def granted() -> bool:
        return (await registry.claim("gw-1", successor)).granted

    await wait_until_async(granted, TTL_S + 10, "the successor's claim")
    assert time.monotonic() - started >= TTL_S * 0.9  # not before the old heartbeat expired


async def test_heartbeat_answers_each_standing(fleet: Fleet) -> None:
    registry = HostRegistry(fleet.client, fleet.keys, ttl_s=TTL_S)
    lease = RedisCapacity(fleet.client, fleet.keys, Ceiling.LEASE, "gw-1")
    me = new_instance_id()
    claim = await registry.claim("gw-1", me)
    assert (await registry.heartbeat("gw-1", me, claim.epoch, claim.incarnation)).standing == Standing.LIVE
    await lease.reserve("acct", "k1", None)

    async def reaped() -> list[Reaped]:
        return (await registry.reap_dead())[1]

    released = await wait_until_async(reaped, TTL_S + 10, "gw-1 to be reaped")
    assert released == [Reaped(host_id="gw-1", table=Ceiling.LEASE, holder="k1", account_id="acct")]
    beat = await registry.heartbeat("gw-1", me, claim.epoch, claim.incarnation)
    assert (beat.standing, beat.epoch) == (Standing.REAPED, claim.epoch + 1)

    other = new_instance_id()
    assert (await registry.claim("gw-1", other)).granted  # reaped: the id was free
    assert (await registry.heartbeat("gw-1", me, claim.epoch, claim.incarnation)).standing == Standing.SUPERSEDED
    assert (await registry.heartbeat("gw-1", other, beat.epoch, claim.incarnation)).standing == Standing.LIVE
    assert (await registry.heartbeat("gw-1", other, beat.epoch, "inc-other")).standing == Standing.STATE_LOST


async def test_live_and_dead_hosts(fleet: Fleet) -> None:
    registry = HostRegistry(fleet.client, fleet.keys, ttl_s=TTL_S)
    ghost = RedisCapacity(fleet.client, fleet.keys, Ceiling.REQUEST, "ghost")
    await ghost.reserve("acct", "att-1", None)  # holds capacity, never heartbeated: dead at once
    claim = await registry.claim("gw-1", new_instance_id())
    live = await registry.live_hosts()
    assert list(live) == ["gw-1"] and abs(live["gw-1"] - _redis_ms(fleet)) < 5_000
    assert await registry.dead_hosts() == ["ghost"]
    assert (await registry.reap_dead())[0] == ["ghost"] and not await ghost.holds("att-1")
    assert claim.granted and await registry.dead_hosts() == []


async def test_a_dead_hosts_slots_return_within_the_ttl_and_one_heartbeat(fleet: Fleet) -> None:
    """SPEC §16: gw-a dies holding lease and request slots; gw-b's beat reaps them within the TTL
    plus one beat of gw-a's last heartbeat (Redis's clock), not before the TTL. gw-a then comes
    back, finds itself reaped, and its recovery sees which holders it lost."""
    interval_s = TTL_S / 3
    registry = HostRegistry(fleet.client, fleet.keys, ttl_s=TTL_S)
    reaped_seen: list[Reaped] = []
    recovered: list[tuple[Standing, HostClaim, list[str]]] = []
    lease_a = RedisCapacity(fleet.client, fleet.keys, Ceiling.LEASE, "gw-a")
    request_a = RedisCapacity(fleet.client, fleet.keys, Ceiling.REQUEST, "gw-a")

    async def on_reaped(released: list[Reaped]) -> None:
        reaped_seen.extend(released)

    async def recover(standing: Standing, claim: HostClaim) -> None:
        lost = [h for h in ("k1", "k2") if not await lease_a.holds(h)]  # the leases to end
        recovered.append((standing, claim, lost))

    a = Membership(registry, "gw-a", recover=recover, interval_s=interval_s)
    b = Membership(registry, "gw-b", recover=recover, on_reaped=on_reaped, interval_s=interval_s)
    for member in (a, b):
        member.registered(await member.join())
    await lease_a.reserve("acct", "k1", 2)
    await lease_a.reserve("acct", "k2", 2)
    await request_a.reserve("acct", "att-1", 1)
    b_loop = asyncio.create_task(b.run())
    try:
        await a.beat()  # gw-a's last heartbeat; then it dies
        last_seen = (await registry.live_hosts())["gw-a"]

        async def slots_back() -> bool:
            return await lease_a.count("acct") == 0 and await request_a.count("acct") == 0

        await wait_until_async(slots_back, TTL_S + 10, "gw-a's slots back", interval_s=0.01)
        waited_ms = _redis_ms(fleet) - last_seen
        assert TTL_S * 1000 <= waited_ms <= (TTL_S + interval_s) * 1000 + 1_000, waited_ms
        assert {(r.table, r.holder) for r in reaped_seen} == {
            (Ceiling.LEASE, "k1"),
            (Ceiling.LEASE, "k2"),
            (Ceiling.REQUEST, "att-1"),
        }

        assert await a.beat() == Standing.REAPED  # gw-a is back
        standing, claim, lost = recovered[0]
        assert (standing, claim.epoch, lost) == (Standing.REAPED, 1, ["k1", "k2"])
        assert a.standing == Standing.LIVE and await a.beat() == Standing.LIVE
    finally:
        b_loop.cancel()
        await asyncio.gather(b_loop, return_exceptions=True)


async def test_membership_recovers_after_redis_lost_its_data(tmp_path: Path) -> None:
    """FLUSHALL: the next beat finds `state-lost`, claims again, hands the new claim to recover
    (which re-registers) and only then moves the fence, so reserves were refused meanwhile."""
    server = RedisServer(tmp_path / "redis").start()
    fleet = Fleet(server)
    try:
        registry = HostRegistry(fleet.client, fleet.keys, ttl_s=10)
        seen_fence: list[str | None] = []
        member: Membership

        async def recover(standing: Standing, claim: HostClaim) -> None:
            seen_fence.append(member.fence.value)
            assert await lease.reregister([("acct", "k1", 1)], incarnation=claim.incarnation) == []

        member = Membership(registry, "gw-a", recover=recover)
        lease = RedisCapacity(fleet.client, fleet.keys, Ceiling.LEASE, "gw-a", member.fence)
        first = await member.join()
        member.registered(first)
        assert await lease.reserve("acct", "k1", 1)
        fleet.admin().flushall()
        assert await member.beat() == Standing.STATE_LOST
        assert seen_fence == [first.incarnation]  # recover ran before the fence moved
        assert member.fence.value != first.incarnation and await lease.holds("k1")
        assert not await lease.reserve("acct", "k2", 1)  # the re-registered holder fills the ceiling
    finally:
        await fleet.close()
        server.stop()


async def _never(standing: Standing, claim: HostClaim) -> None:
    raise AssertionError("no recovery expected")
