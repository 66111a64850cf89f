"""A fleet mint reads the candidates' live facts in the same round as the chains' refresh
(issue 27: one Redis round less), on the policy as last validated, and keeps those reads only
when the refreshed chains yield the same candidates: a policy written on another host just
before is still obeyed. Real redis-server, controls wired as the daemon is."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.fleethosts import FleetHosts, accounts, mint
from tests.support.redis_server import RedisServer

A, B = "acct-a", "acct-b"


@pytest.fixture
async def hosts(tmp_path: Path) -> AsyncIterator[FleetHosts]:
    server = RedisServer(tmp_path / "redis").start()
    fleet = FleetHosts(tmp_path, server.url, "t", accounts({A: 2, B: None}))
    try:
        yield fleet
    finally:
        await fleet.stop_all()
        server.stop()


async def test_the_live_reads_overlap_the_chains_refresh(hosts: FleetHosts) -> None:
    h1 = await hosts.add("h1")
    assert (await mint(h1, "warm")).status == 201  # the chains validated once
    desk = h1.desk
    read_started = asyncio.Event()
    admits, refresh = desk.circuits.admits, desk.admin.refresh

    async def noting_admits(account_id: str, now: int) -> bool:
        read_started.set()
        return await admits(account_id, now)

    async def refresh_after_the_reads() -> None:
        await refresh()
        await asyncio.wait_for(read_started.wait(), 5)  # never set: the reads waited for us

    desk.circuits.admits = noting_admits  # type: ignore[method-assign]
    desk.admin.refresh = refresh_after_the_reads  # type: ignore[method-assign]
    answer = await mint(h1, "d1")
    assert answer.status == 201 and answer.body["account_id"] == A, answer.body


async def test_reads_on_a_stale_policy_are_not_kept(hosts: FleetHosts) -> None:
    h1, h2 = await hosts.add("h1"), await hosts.add("h2")
    assert (await mint(h2, "warm")).body["account_id"] == A  # h2's chains validated: A first
    await h1.policy.put_level(
        "platform", {"account_order": [B]}, expected_revision=0, reason="r", actor=None, authenticated_by="t"
    )
    for n in range(3):  # h2 read early on [A, B]; its refresh finds [B]: read again, and obey
        assert (await mint(h2, f"d{n}")).body["account_id"] == B
