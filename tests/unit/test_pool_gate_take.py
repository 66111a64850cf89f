"""`_Gate.take`: a pool slot now, or False when `acquire` would wait (a fleet admission still
out is then awaited first: a refused request never waits for the pool, issue 27 §4)."""

from __future__ import annotations

import asyncio

import pytest

from dataplane.upstreams import _Gate


@pytest.mark.parametrize(
    ("size", "in_use", "waiting", "taken"),
    [
        (1, 0, 0, True),
        (2, 1, 0, True),
        (1, 1, 0, False),  # full
        (2, 1, 1, False),  # a free slot, but someone waits before us
    ],
)
async def test_take(size: int, in_use: int, waiting: int, taken: bool) -> None:
    gate = _Gate(size)
    gate.in_use = in_use
    for _ in range(waiting):
        gate._waiters.append(asyncio.get_running_loop().create_future())
    assert gate.take() is taken
    assert gate.in_use == in_use + (1 if taken else 0)
