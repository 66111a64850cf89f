"""Each host's open WebSockets on the fleet's Redis (SPEC §20, §19), over a real redis-server:
what a host writes the others read back; an entry without the fleet's MAC, or whose count is
not an integer in range, is skipped and counted, and the rest of the hash still counts."""

from __future__ import annotations

import secrets

from controlplane.fleet.sockets import SocketsBoard
from shared.fleet.entries import EntryKind, FleetEntries
from shared.fleet.secret import FleetSecret, Keyring
from tests.support.fleet import Fleet


def board(fleet: Fleet, entries: FleetEntries | None = None) -> SocketsBoard:
    return SocketsBoard(fleet.client, fleet.keys, entries or fleet.entries, ttl_s=3)


async def test_hosts_sum_and_a_host_rewrites_its_own(fleet: Fleet) -> None:
    await board(fleet).write("gw-a", {"acct-1": 2, "acct-2": 1, "acct-3": 0})
    await board(fleet).write("gw-b", {"acct-1": 3})
    assert await board(fleet).read(["gw-a", "gw-b", "gw-gone"]) == {"acct-1": 5, "acct-2": 1}
    await board(fleet).write("gw-a", {})  # its sockets closed
    assert await board(fleet).read(["gw-a", "gw-b"]) == {"acct-1": 3}
    ttl = await fleet.client.pttl(fleet.keys.host_sockets("gw-b"))
    assert 0 < ttl <= 6000  # a dead host's count vanishes


async def test_forged_and_garbage_entries_are_skipped_and_counted(fleet: Fleet) -> None:
    mine = board(fleet)
    stranger = board(fleet, FleetEntries(Keyring(FleetSecret(secrets.token_bytes(32)), fleet.keys.fleet_id)))
    key = fleet.keys.host_sockets("gw-b")
    await mine.write("gw-b", {"acct-1": 2})
    good = mine.entry("gw-b", "acct-1", 2)
    await fleet.client.hset(
        key,
        mapping={
            "acct-2": stranger.entry("gw-b", "acct-2", 50),  # a writer without the secret
            "acct-3": good,  # a MAC moved to another account
            "acct-4": "7",  # no MAC
            "acct-5": "-1." + good.partition(".")[2],  # out of range
            "acct-6": "²." + good.partition(".")[2],  # not ASCII digits
            "acct-7": "9" * 40 + ".x",  # far out of range
            b"\xff": good,  # not UTF-8
        },
    )
    before = fleet.entries.rejected[EntryKind.SOCKETS]
    assert await mine.read(["gw-b"]) == {"acct-1": 2}
    assert fleet.entries.rejected[EntryKind.SOCKETS] - before == 7
