"""A ceilinged request's fleet reserve overlapped with the upstream request's preparation
(issue 27 §4, SPEC §16): the reserve is written to Redis after every local check, the answer
awaited right before the first byte goes upstream. Whatever the answer, or however the request
ends while the reserve is out (a full account, Redis hung, the worker gone, a busy pool that
times out, the drain), nothing reaches the upstream but what was admitted, the pool slot comes
back, the holder is released (never leaked) and the attempt has one row, as when the answer was
awaited first.

The data plane runs in this process (`tests/support/inprocess.py`, for its `FleetAdmission`,
its gates and rows) against the stub and a redis-server of the test's own (paused: SIGSTOP).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from dataplane.admission import FleetAdmission
from dataplane.upstreams import _Gate
from shared.fleet.redis_client import connect
from tests.support.attempts import A_BODY, A_HEADERS, step
from tests.support.fleet import Fleet
from tests.support.harness import Stub
from tests.support.inprocess import Plane, anthropic_plane
from tests.support.redis_server import RedisServer
from tests.support.waits import until

ACCOUNT = "capped-anthropic"


@pytest.fixture
async def own_redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.resume()
    server.stop()


@pytest.fixture
async def fleet_of(own_redis: RedisServer) -> AsyncIterator[Fleet]:
    made = Fleet(own_redis)
    yield made
    await made.close()


@pytest.fixture
async def admission(fleet_of: Fleet) -> AsyncIterator[FleetAdmission]:
    made = FleetAdmission(connect(fleet_of.server.url), fleet_of.keys.fleet_id, "host-a")
    await made.start()
    yield made
    await made.close()


async def served_once(session: aiohttp.ClientSession, plane: Plane, headers: dict[str, str], stub: Stub) -> int:
    """One request served first (the fleet's line and the upstream connection are open); the
    upstream's call count after it."""
    async with session.post(plane.url, json=A_BODY, headers=headers) as served:
        assert served.status == 200
    return upstream_calls(stub)


async def waiting_on_redis(
    session: aiohttp.ClientSession, plane: Plane, headers: dict[str, str], own_redis: RedisServer
) -> asyncio.Future[aiohttp.ClientResponse]:
    """Redis paused, a request sent and in flight on the data plane, waiting on its reserve."""
    own_redis.pause()
    going = asyncio.ensure_future(session.post(plane.url, json=A_BODY, headers=headers))
    await until(lambda: len(plane.proxy.in_flight) == 1, 10, "the request waiting on Redis")
    return going


def upstream_calls(stub: Stub) -> int:
    return len([r for r in stub.requests() if r.get("path") == "/v1/messages"])


def gate(plane: Plane) -> _Gate:
    return plane.proxy.pools.gate_for(ACCOUNT)


async def count(admission: FleetAdmission) -> int:
    return await admission.capacity.count(ACCOUNT)


def released(admission: FleetAdmission):
    async def probe() -> bool:
        await admission.retry_pending()
        return not admission.pending_release and await count(admission) == 0

    return probe


def last_id(plane: Plane) -> str:
    """The attempt id of the last row (with it, a carried release may be pending too)."""
    return list(plane.link.outbox.values())[-1].attempt_id


def rows(plane: Plane) -> list[tuple[str, str | None, int]]:
    return [(r.status, r.refusal_reason, r.http_status) for r in plane.link.outbox.values()]


async def test_the_reserve_is_written_before_its_answer_is_awaited(admission: FleetAdmission) -> None:
    """`send_reserve` writes the script at once: Redis holds the slot before anyone reads the
    answer; an abandoned one is released (with the releases it carried) within the window."""
    assert not await admission.reserve(ACCOUNT, "warm", 0)  # the line open (a ceiling of 0 takes nothing)
    sent = admission.send_reserve(ACCOUNT, "att-1", 2)
    await until(lambda: _count_is(admission, 1), 10, "the reserve run by Redis, unawaited")
    assert await sent.answer() and admission.held == {"att-1": (ACCOUNT, 2)}
    admission.release_soon("att-1")  # owed: rides along with the next reserve
    left = admission.send_reserve(ACCOUNT, "att-2", 2)
    assert not admission.owed
    left.abandon()  # never asked: its holder and the release it carried, owed again
    assert set(admission.owed) == {"att-1", "att-2"}
    await until(lambda: _count_is(admission, 0), 10, "both released within the window")
    left.abandon()  # twice: nothing more
    assert await admission.reserve(ACCOUNT, "att-3", 1)  # the connection stayed in step


async def test_a_first_reserve_opens_the_line_and_is_answered(fleet_of: Fleet) -> None:
    """No connection yet: the reserve is written once the line is open (its opening started at
    the send), answered as any other."""
    made = FleetAdmission(connect(fleet_of.server.url), fleet_of.keys.fleet_id, "host-b")
    try:
        await made.start()
        assert made.line._wire is None
        sent = made.send_reserve(ACCOUNT, "att-1", 1)
        assert made.line._opening is not None
        assert await sent.answer()
        assert not await made.send_reserve(ACCOUNT, "att-2", 1).answer()
    finally:
        await made.close()


async def _count_is(admission: FleetAdmission, expected: int) -> bool:
    return await count(admission) == expected


async def test_a_full_account_is_refused_before_anything_goes_upstream(
    clean_stub: Stub, tmp_path: Path, admission: FleetAdmission
) -> None:
    async with anthropic_plane(clean_stub, tmp_path, ACCOUNT, 1, fleet=admission) as plane:
        headers = {**A_HEADERS, "x-api-key": plane.token}
        async with aiohttp.ClientSession() as session:
            async with session.post(plane.url, json=A_BODY, headers=headers) as served:
                assert served.status == 200  # (a kept-alive upstream connection now)
            await until(lambda: _count_is(admission, 0), 10, "the first slot released")
            calls = upstream_calls(clean_stub)
            assert await admission.capacity.reserve(ACCOUNT, "elsewhere", 1)  # another host's
            async with session.post(plane.url, json=A_BODY, headers=headers) as refused:
                body = await refused.json()
                assert (refused.status, refused.headers["retry-after"]) == (429, "1")
                assert body["error"]["code"] == "request-capacity-exhausted"
            assert upstream_calls(clean_stub) == calls
            assert gate(plane).in_use == 0
            await admission.capacity.release("elsewhere")
            async with session.post(plane.url, json=A_BODY, headers=headers) as again:
                assert again.status == 200  # the parked connection still serves
        await until(lambda: not plane.proxy.in_flight, 10, "no attempt in flight")
    assert rows(plane) == [
        ("completed", None, 200),
        ("refused", "request-capacity-exhausted", 429),
        ("completed", None, 200),
    ]
    assert upstream_calls(clean_stub) == calls + 1


async def test_redis_hung_is_503_nothing_upstream_and_the_holder_released_later(
    clean_stub: Stub, tmp_path: Path, admission: FleetAdmission, own_redis: RedisServer
) -> None:
    async with anthropic_plane(clean_stub, tmp_path, ACCOUNT, 1, fleet=admission) as plane:
        headers = {**A_HEADERS, "x-api-key": plane.token}
        async with aiohttp.ClientSession() as session:
            calls = await served_once(session, plane, headers, clean_stub)
            own_redis.pause()
            async with session.post(plane.url, json=A_BODY, headers=headers) as refused:
                body = await refused.json()
                assert (refused.status, body["error"]["code"]) == (503, "fleet-state-unavailable")
            assert upstream_calls(clean_stub) == calls and gate(plane).in_use == 0
            assert last_id(plane) in admission.pending_release  # the timed-out reserve's holder
            own_redis.resume()
            await until(released(admission), 10, "the timed-out reserve's holder released")
    assert rows(plane) == [("completed", None, 200), ("refused", "fleet-state-unavailable", 503)]


async def test_a_worker_gone_while_the_reserve_is_out_leaves_one_row_and_no_slot(
    clean_stub: Stub, tmp_path: Path, admission: FleetAdmission, own_redis: RedisServer
) -> None:
    async with anthropic_plane(clean_stub, tmp_path, ACCOUNT, 1, fleet=admission) as plane:
        headers = {**A_HEADERS, "x-api-key": plane.token}
        async with aiohttp.ClientSession() as session:
            calls = await served_once(session, plane, headers, clean_stub)
            going = await waiting_on_redis(session, plane, headers, own_redis)
            going.cancel()  # the worker goes away while its reserve is out
            with pytest.raises(asyncio.CancelledError):
                await going
            await until(lambda: not plane.proxy.in_flight, 10, "the attempt ended")
            assert gate(plane).in_use == 0 and last_id(plane) in admission.pending_release
            own_redis.resume()
            await until(released(admission), 10, "the gone worker's holder released")
            assert upstream_calls(clean_stub) == calls
            async with session.post(plane.url, json=A_BODY, headers=headers) as again:
                assert again.status == 200  # the one slot is free again
    assert [r[0] for r in rows(plane)] == ["completed", "client-aborted", "completed"]


async def test_a_busy_pool_asks_the_fleet_first_and_a_pool_timeout_releases_the_slot(
    clean_stub: Stub, tmp_path: Path, admission: FleetAdmission
) -> None:
    """The account's one pool slot is taken by a stream: a refused request is refused at once
    (it never waits for the pool), an admitted one waits, times out 503 `pool-timeout`, and its
    fleet slot comes back."""
    env = {"GATEWAY_UPSTREAM_POOL_SIZE": "1", "GATEWAY_UPSTREAM_POOL_TIMEOUT": "0.3"}
    async with anthropic_plane(clean_stub, tmp_path, ACCOUNT, 2, fleet=admission, env=env) as plane:
        headers = {**A_HEADERS, "x-api-key": plane.token}
        async with aiohttp.ClientSession() as session:
            holder = await session.post(
                plane.url,
                json={**A_BODY, "stream": True},
                headers={**headers, **step(stall_after_events=3, stall_s=30)},
            )
            assert holder.status == 200
            await holder.content.readuntil(b"event: ping")
            assert gate(plane).in_use == 1 and await count(admission) == 1

            async with session.post(plane.url, json=A_BODY, headers=headers) as waited:
                body = await waited.json()
                assert (waited.status, body["error"]["code"]) == (503, "pool-timeout")
            await until(lambda: _count_is(admission, 1), 10, "the timed-out request's fleet slot back")

            assert await admission.capacity.reserve(ACCOUNT, "elsewhere", 2)  # the account full
            started = asyncio.get_running_loop().time()
            async with session.post(plane.url, json=A_BODY, headers=headers) as refused:
                body = await refused.json()
                assert (refused.status, body["error"]["code"]) == (429, "request-capacity-exhausted")
            assert asyncio.get_running_loop().time() - started < 0.3  # not after the pool's wait
            holder.close()
            await until(lambda: gate(plane).in_use == 0 and not plane.proxy.in_flight, 10, "the stream ended")
            await admission.capacity.release("elsewhere")
            await until(lambda: _count_is(admission, 0), 10, "every fleet slot back")
    assert [(r[0], r[1]) for r in rows(plane)] == [
        ("refused", "pool-timeout"),
        ("refused", "request-capacity-exhausted"),
        ("client-aborted", None),
    ]


async def test_the_drain_while_the_reserve_is_out_ends_the_attempt_and_releases_it(
    clean_stub: Stub, tmp_path: Path, admission: FleetAdmission, own_redis: RedisServer
) -> None:
    async with anthropic_plane(clean_stub, tmp_path, ACCOUNT, 1, fleet=admission) as plane:
        headers = {**A_HEADERS, "x-api-key": plane.token}
        async with aiohttp.ClientSession() as session:
            calls = await served_once(session, plane, headers, clean_stub)
            going = await waiting_on_redis(session, plane, headers, own_redis)
            plane.proxy.draining = True
            assert plane.proxy.stop_all() == 1  # the drain window ran out
            async with await going as shut:
                body = await shut.json()
                assert (shut.status, body["error"]["code"]) == (503, "gateway-shutdown")
            assert gate(plane).in_use == 0 and last_id(plane) in admission.pending_release
            own_redis.resume()
            await until(released(admission), 10, "the stopped attempt's holder released")
            assert upstream_calls(clean_stub) == calls
    assert rows(plane) == [("completed", None, 200), ("refused", "gateway-shutdown", 503)]


async def test_a_headers_bound_shorter_than_redis_wait_refuses_503_not_an_upstream_timeout(
    clean_stub: Stub, tmp_path: Path, admission: FleetAdmission, own_redis: RedisServer
) -> None:
    """The exchange's watch is set up while the reserve is out: its headers bound running out on
    Redis's wait is the fleet's failure (503 `fleet-state-unavailable`, nothing upstream), never
    an upstream timeout; once answered, the upstream's wait is bounded from the answer."""
    env = {"GATEWAY_UPSTREAM_HEADERS_TIMEOUT": "0.2"}
    async with anthropic_plane(clean_stub, tmp_path, ACCOUNT, 1, fleet=admission, env=env) as plane:
        headers = {**A_HEADERS, "x-api-key": plane.token}
        async with aiohttp.ClientSession() as session:
            calls = await served_once(session, plane, headers, clean_stub)
            own_redis.pause()
            async with session.post(plane.url, json=A_BODY, headers=headers) as refused:
                body = await refused.json()
                assert (refused.status, body["error"]["code"]) == (503, "fleet-state-unavailable")
            assert upstream_calls(clean_stub) == calls and gate(plane).in_use == 0
            assert last_id(plane) in admission.pending_release
            own_redis.resume()
            await until(released(admission), 10, "the holder released")
    assert rows(plane) == [("completed", None, 200), ("refused", "fleet-state-unavailable", 503)]


async def test_a_bug_before_the_write_abandons_the_reserve_and_releases_its_holder(
    clean_stub: Stub, tmp_path: Path, admission: FleetAdmission, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay fails while preparing (a bug): 500 `internal-error`, one row, nothing upstream,
    the pool slot back, and the reserve never asked is released within the window."""
    async with anthropic_plane(clean_stub, tmp_path, ACCOUNT, 1, fleet=admission) as plane:
        headers = {**A_HEADERS, "x-api-key": plane.token}
        async with aiohttp.ClientSession() as session:
            calls = await served_once(session, plane, headers, clean_stub)

            def broken(*_args: object) -> object:
                raise RuntimeError("a bug in the preparation")

            monkeypatch.setattr(plane.proxy.pools, "url_for", broken)
            async with session.post(plane.url, json=A_BODY, headers=headers) as failed:
                body = await failed.json()
                assert (failed.status, body["error"]["code"]) == (500, "internal-error")
            assert upstream_calls(clean_stub) == calls and gate(plane).in_use == 0
            await until(lambda: _count_is(admission, 0), 10, "the abandoned reserve's holder released")
            assert not admission.pending_release and not admission.held
            monkeypatch.undo()
            async with session.post(plane.url, json=A_BODY, headers=headers) as again:
                assert again.status == 200  # the one slot was not leaked
    assert rows(plane) == [("completed", None, 200), ("refused", "internal-error", 500), ("completed", None, 200)]
