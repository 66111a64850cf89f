"""The exchange watch: one timer for the headers timeout and the body's idle timeout."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from dataplane.watch import ExchangeWatch, IdleTimeout


class _Protocol:
    """What an aiohttp StreamReader asks of its protocol (flow control only)."""

    _reading_paused = False
    connected = True

    def pause_reading(self) -> None:
        self._reading_paused = True

    def resume_reading(self) -> None:
        self._reading_paused = False


def stream() -> aiohttp.StreamReader:
    return aiohttp.StreamReader(_Protocol(), 2**16, loop=asyncio.get_running_loop())  # type: ignore[arg-type]


async def never() -> None:
    await asyncio.get_running_loop().create_future()


async def test_the_headers_deadline_cancels_and_is_recognised_as_its_own() -> None:
    loop = asyncio.get_running_loop()
    watch = ExchangeWatch(loop, headers_s=0.05, idle_s=10)
    started = loop.time()
    with pytest.raises(asyncio.CancelledError):
        await never()
    assert watch.timed_out() and loop.time() - started >= 0.04
    assert asyncio.current_task().cancelling() == 0  # uncancelled: the task goes on
    watch.stop()


async def test_another_cancellation_is_not_a_timeout() -> None:
    async def exchange() -> str:
        watch = ExchangeWatch(asyncio.get_running_loop(), headers_s=10, idle_s=10)
        try:
            await never()
        except asyncio.CancelledError:
            if watch.timed_out():
                return "timeout"
            raise
        finally:
            watch.stop()
        return "answered"

    task = asyncio.ensure_future(exchange())
    await asyncio.sleep(0)
    task.cancel()  # the worker went away
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_read_idle_past_the_timeout_fails_the_stream() -> None:
    loop = asyncio.get_running_loop()
    watch = ExchangeWatch(loop, headers_s=10, idle_s=0.05)
    content = stream()
    watch.body(content)
    content.feed_data(b"first")
    watch.reading_since = loop.time()
    assert await content.readany() == b"first"
    watch.reading_since = loop.time()
    started = loop.time()
    with pytest.raises(IdleTimeout):
        await content.readany()
    assert loop.time() - started >= 0.04
    watch.stop()


async def test_time_spent_writing_to_the_worker_is_not_idle() -> None:
    loop = asyncio.get_running_loop()
    watch = ExchangeWatch(loop, headers_s=10, idle_s=0.05)
    content = stream()
    watch.body(content)
    watch.reading_since = None  # writing a chunk to a slow worker, well past the idle timeout
    done = loop.create_future()
    loop.call_later(0.15, done.set_result, None)
    await done
    assert content.exception() is None
    content.feed_data(b"next")
    watch.reading_since = loop.time()
    assert await content.readany() == b"next"
    watch.stop()


async def test_a_short_exchange_leaves_no_timer() -> None:
    loop = asyncio.get_running_loop()
    watch = ExchangeWatch(loop, headers_s=10, idle_s=10)
    watch.body(stream())
    watch.stop()
    assert watch.handle is None


async def test_a_write_the_worker_does_not_accept_for_the_stall_bound_calls_on_stall() -> None:
    """SPEC §19: a worker that accepts no byte for GATEWAY_CLIENT_STALL_SECONDS is cut."""
    loop = asyncio.get_running_loop()
    stalled = loop.create_future()
    watch = ExchangeWatch(loop, headers_s=10, idle_s=10, stall_s=0.05)
    content = stream()
    watch.body(content, lambda: stalled.set_result(loop.time()))
    watch.reading_since = None
    watch.writing_since = started = loop.time()  # a write that never completes
    at = await asyncio.wait_for(stalled, 5)
    assert 0.04 <= at - started < 2 and content.exception() is None
    watch.stop()


async def test_a_read_as_long_as_the_stall_bound_is_no_stall() -> None:
    loop = asyncio.get_running_loop()
    watch = ExchangeWatch(loop, headers_s=10, idle_s=10, stall_s=0.05)
    content = stream()
    stalls: list[float] = []
    watch.body(content, lambda: stalls.append(loop.time()))
    watch.writing_since = loop.time()
    watch.reading_since = loop.time()  # waiting on the upstream, not on the worker
    done = loop.create_future()
    loop.call_later(0.2, done.set_result, None)
    await done
    assert stalls == [] and content.exception() is None
    watch.stop()


async def test_a_body_that_begins_after_a_headers_phase_check_is_still_guarded() -> None:
    """The timer is armed once for every bound (no re-arm when the body begins): a check that
    falls in the headers phase re-arms at the body's pace, so a stall that starts later is
    still caught at about the bound, not at the (far) headers deadline."""
    loop = asyncio.get_running_loop()
    watch = ExchangeWatch(loop, headers_s=600, idle_s=600, stall_s=0.1)
    wait = loop.create_future()
    loop.call_later(0.25, wait.set_result, None)  # two or more checks in the headers phase
    await wait
    stalled = loop.create_future()
    watch.body(stream(), lambda: stalled.set_result(loop.time()))
    watch.reading_since = None
    watch.writing_since = started = loop.time()
    at = await asyncio.wait_for(stalled, 5)
    assert 0.09 <= at - started < 2
    watch.stop()
