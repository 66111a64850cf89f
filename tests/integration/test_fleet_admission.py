"""The data plane's fleet-wide request admission (SPEC §6, §16) against a real redis-server:
two data planes (hosts) share a ceiling, a restart forgets the dead instance's slots, a release
Redis could not take is retried, Redis down is `StateUnavailable`, and after Redis lost its data
the in-flight holders are re-registered before anything new is admitted."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dataplane.admission import FleetAdmission
from shared.capacity import StateUnavailable
from shared.fleet.keys import Ceiling
from shared.fleet.redis_client import connect
from tests.support.fleet import Fleet
from tests.support.redis_server import RedisServer
from tests.support.waits import until

ACCOUNT = "capped"


def plane(fleet: Fleet, host: str, url: str | None = None) -> FleetAdmission:
    return FleetAdmission(connect(url or fleet.server.url), fleet.keys.fleet_id, host)


async def test_two_data_planes_share_one_ceiling_and_release_after_the_answer(fleet: Fleet) -> None:
    a, b = plane(fleet, "host-a"), plane(fleet, "host-b")
    try:
        assert await a.reserve(ACCOUNT, "att-1", 2) and await b.reserve(ACCOUNT, "att-2", 2)
        assert not await b.reserve(ACCOUNT, "att-3", 2) and not await a.reserve(ACCOUNT, "att-4", 2)
        a.release_soon("att-1")
        await until(lambda: b.reserve(ACCOUNT, "att-5", 2), 5, "the released slot taken on the other host")
        assert await b.capacity.count(ACCOUNT) == 2
        a.release_soon("att-1")  # twice, and for a holder never held here: harmless
        a.release_soon("never")
    finally:
        await a.close()
        await b.close()


async def _evalsha_calls(fleet: Fleet) -> int:
    stats = await fleet.client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_the_next_reserve_carries_the_release_in_one_round_trip(fleet: Fleet) -> None:
    """Issue 27: a request's release rides along with the next reserve (released first, in the
    same script): at a ceiling of one, the next request still gets the slot, and the two
    requests cost Redis three scripts, not four."""
    a = plane(fleet, "host-a")
    try:
        assert await a.reserve(ACCOUNT, "att-0", 1)  # warm: both scripts loaded, nothing owed
        a.release_soon("att-0")
        assert await a.reserve(ACCOUNT, "att-00", 1)
        assert a.held.pop("att-00") and await a.capacity.release("att-00")
        before = await _evalsha_calls(fleet)
        assert await a.reserve(ACCOUNT, "att-1", 1)
        a.release_soon("att-1")
        assert await a.reserve(ACCOUNT, "att-2", 1)  # att-1's slot, released by this very script
        assert await a.capacity.holds("att-2") and not await a.capacity.holds("att-1")
        assert await a.capacity.count(ACCOUNT) == 1
        assert await _evalsha_calls(fleet) - before == 2  # two reserves; no release of its own
        assert a.owed == []
    finally:
        await a.close()


async def test_a_release_no_reserve_carries_is_sent_within_the_window(fleet: Fleet) -> None:
    a, b = plane(fleet, "host-a"), plane(fleet, "host-b")
    try:
        assert await a.reserve(ACCOUNT, "att-1", 1) and await a.reserve(ACCOUNT, "att-2", 2)
        before = await _evalsha_calls(fleet)
        a.release_soon("att-1")
        a.release_soon("att-2")

        async def none_held() -> bool:
            return await b.capacity.count(ACCOUNT) == 0

        await until(none_held, 5, "both released when the window ended")
        assert a.owed == [] and await _evalsha_calls(fleet) - before == 1  # in one script
    finally:
        await a.close()
        await b.close()


async def test_closing_sends_the_releases_still_owed(fleet: Fleet) -> None:
    a = plane(fleet, "host-a")
    assert await a.reserve(ACCOUNT, "att-1", 1)
    a.release_soon("att-1")
    await a.close()
    assert await fleet.client.hlen(fleet.keys.cap_account(Ceiling.REQUEST, ACCOUNT)) == 0


async def test_a_restarted_data_plane_forgets_its_dead_instances_slots(fleet: Fleet) -> None:
    first = plane(fleet, "host-a")
    assert await first.reserve(ACCOUNT, "att-1", 1)
    await first.client.aclose()  # the instance dies with its attempt in flight
    second = plane(fleet, "host-a")
    other = plane(fleet, "host-b")
    try:
        assert not await other.reserve(ACCOUNT, "att-2", 1)
        await second.start()
        assert await other.reserve(ACCOUNT, "att-2", 1)
    finally:
        await second.close()
        await other.close()


async def test_redis_down_is_unavailable_and_a_failed_release_is_retried(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    fleet = Fleet(server)
    admission = plane(fleet, "host-a", server.url)
    try:
        assert await admission.reserve(ACCOUNT, "att-1", 1)
        server.pause()
        admission.release_soon("att-1")
        with pytest.raises(StateUnavailable):
            await admission.reserve(ACCOUNT, "att-2", 1)
        await until(lambda: "att-1" in admission.pending_release, 10, "the failed release kept")
        server.resume()
        await until(_retried(admission), 10, "the release retried once Redis is back")
        assert await admission.reserve(ACCOUNT, "att-3", 1)  # the slot came back: nothing leaked
    finally:
        server.resume()
        await admission.close()
        await fleet.close()
        server.stop()


async def test_a_reserve_redis_ran_after_its_timeout_is_released(tmp_path: Path) -> None:
    """A reserve sent to a hung Redis times out (refused 503), but Redis runs it once it
    resumes: the holder is released like a failed release, never leaked."""
    server = RedisServer(tmp_path / "redis").start()
    fleet = Fleet(server)
    admission = plane(fleet, "host-a", server.url)
    try:
        assert await admission.reserve(ACCOUNT, "warm", 1)  # a pooled connection, ready to send on
        admission.release_soon("warm")
        await until(lambda: _count_is(admission, 0), 10, "the warm-up slot back")
        server.pause()
        with pytest.raises(StateUnavailable):
            await admission.reserve(ACCOUNT, "att-hung", 1)
        assert "att-hung" in admission.pending_release
        server.resume()
        await until(_retried(admission), 10, "the timed-out reserve's holder released")
        assert await admission.capacity.count(ACCOUNT) == 0
        assert await admission.reserve(ACCOUNT, "att-next", 1)  # the slot was never lost
    finally:
        server.resume()
        await admission.close()
        await fleet.close()
        server.stop()


async def test_a_reserve_cancelled_in_flight_is_released_never_leaked(tmp_path: Path) -> None:
    """The worker goes away while its reserve is out (the handler is cancelled): whether or not
    Redis ran it, the holder is released like a timed-out reserve's, and so are the releases it
    carried."""
    server = RedisServer(tmp_path / "redis").start()
    fleet = Fleet(server)
    admission = plane(fleet, "host-a", server.url)
    try:
        assert await admission.reserve(ACCOUNT, "att-1", 2)
        admission.release_soon("att-1")  # owed: rides with the next reserve
        server.pause()
        out = asyncio.ensure_future(admission.reserve(ACCOUNT, "att-gone", 2))
        await until(lambda: not admission.owed, 10, "the reserve sent, carrying the release")
        out.cancel()
        with pytest.raises(asyncio.CancelledError):
            await out
        assert {"att-gone", "att-1"} <= admission.pending_release
        server.resume()
        await until(_retried(admission), 10, "both released")
        assert await admission.capacity.count(ACCOUNT) == 0
    finally:
        server.resume()
        await admission.close()
        await fleet.close()
        server.stop()


async def _count_is(admission: FleetAdmission, count: int) -> bool:
    return await admission.capacity.count(ACCOUNT) == count


def _retried(admission: FleetAdmission):
    async def probe() -> bool:
        await admission.retry_pending()
        return not admission.pending_release

    return probe


async def test_after_redis_lost_its_data_in_flight_holders_come_back_first(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    fleet = Fleet(server)
    admin = fleet.admin()
    admin.set(fleet.keys.incarnation, "inc-1")
    admission = plane(fleet, "host-a", server.url)
    other = plane(fleet, "host-b", server.url)
    try:
        assert await admission.reserve(ACCOUNT, "att-1", 1)  # in flight across the data loss
        server.restart()  # empty
        with pytest.raises(StateUnavailable):  # the fleet's state is not re-established yet
            await admission.reserve(ACCOUNT, "att-2", 1)
        admin.set(fleet.keys.incarnation, "inc-2")  # control re-claimed its host: a new life
        assert not await admission.reserve(ACCOUNT, "att-2", 1)  # att-1 re-registered first: full
        assert await admission.capacity.holds("att-1")
        assert not await other.reserve(ACCOUNT, "att-3", 1)  # the ceiling holds fleet-wide
    finally:
        await admission.close()
        await other.close()
        await fleet.close()
        server.stop()
