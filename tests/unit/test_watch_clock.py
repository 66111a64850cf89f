"""The relay's watch clock (issue 27): every exchange's first timeout check through one timer.
The exchange watch's bounds hold exactly as with a timer of its own; a stopped watch is never
checked and not kept; a watch whose due comes before the last queued one arms its own timer."""

from __future__ import annotations

import asyncio

import pytest

from dataplane import watch as watch_module
from dataplane.watch import ExchangeWatch, IdleTimeout, WatchClock
from tests.unit.test_exchange_watch import never, stream


async def test_the_headers_deadline_through_the_clock_cancels_and_is_its_own() -> None:
    loop = asyncio.get_running_loop()
    clock = WatchClock(loop)
    watch = ExchangeWatch(loop, headers_s=0.05, idle_s=10, clock=clock)
    assert watch.clocked and watch.handle is None
    started = loop.time()
    with pytest.raises(asyncio.CancelledError):
        await never()
    assert watch.timed_out() and loop.time() - started >= 0.04
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    watch.stop()
    clock.stop()


async def test_a_read_idle_past_the_timeout_through_the_clock_fails_the_stream() -> None:
    loop = asyncio.get_running_loop()
    clock = WatchClock(loop)
    watch = ExchangeWatch(loop, headers_s=10, idle_s=0.05, clock=clock)
    content = stream()
    watch.body(content)
    watch.reading_since = started = loop.time()
    with pytest.raises(IdleTimeout):
        await asyncio.wait_for(content.readany(), 5)
    assert loop.time() - started >= 0.04
    watch.stop()
    clock.stop()


async def test_a_stall_through_the_clock_calls_on_stall() -> None:
    loop = asyncio.get_running_loop()
    clock = WatchClock(loop)
    stalled = loop.create_future()
    watch = ExchangeWatch(loop, headers_s=10, idle_s=10, stall_s=0.05, clock=clock)
    watch.body(stream(), lambda: stalled.set_result(loop.time()))
    watch.reading_since = None
    watch.writing_since = started = loop.time()
    at = await asyncio.wait_for(stalled, 5)
    assert at - started >= 0.04
    watch.stop()
    clock.stop()


async def test_each_of_many_live_exchanges_times_out_and_stopped_ones_never_do() -> None:
    loop = asyncio.get_running_loop()
    clock = WatchClock(loop)
    checked: list[int] = []
    watches = []
    for n in range(6):
        watch = ExchangeWatch(loop, headers_s=10, idle_s=0.05, clock=clock)
        content = stream()
        watch.body(content)
        watch.reading_since = loop.time()
        watches.append((n, watch, content))
    for n, watch, _ in watches:
        if n % 2:
            watch.stop()  # a short exchange: never checked, never failed
    for n, _, content in watches:
        if n % 2 == 0:
            with pytest.raises(IdleTimeout):
                await asyncio.wait_for(content.readany(), 5)
            checked.append(n)
    assert checked == [0, 2, 4]
    assert all(content.exception() is None for n, _, content in watches if n % 2)
    for _, watch, _ in watches:
        watch.stop()
    clock.stop()


async def test_an_earlier_due_arms_its_own_timer() -> None:
    loop = asyncio.get_running_loop()
    clock = WatchClock(loop)
    late = ExchangeWatch(loop, headers_s=10, idle_s=10, clock=clock)
    early = ExchangeWatch(loop, headers_s=0.05, idle_s=10, clock=clock)
    assert late.clocked and not early.clocked and early.handle is not None
    early.stop()
    late.stop()
    assert early.handle is None and not late.clocked
    clock.stop()


async def test_stopped_watches_are_not_kept_behind_a_live_one() -> None:
    loop = asyncio.get_running_loop()
    clock = WatchClock(loop)
    live = ExchangeWatch(loop, headers_s=10, idle_s=10, clock=clock)
    for _ in range(3 * watch_module.COMPACT_AT):
        short = ExchangeWatch(loop, headers_s=10, idle_s=10, clock=clock)
        short.body(stream(), lambda: None)
        short.stop()
        assert short.content is None and short.on_stall is None  # nothing of the exchange held
    assert len(clock.queue) <= watch_module.COMPACT_AT + 1
    live.stop()
    clock.stop()
    assert clock.handle is None and not clock.queue
