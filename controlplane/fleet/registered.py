"""The fleet's `registered` set, authenticated (SPEC §16, §19): the hosts that re-registered their
holders in this incarnation of Redis's data. It ends the hold after a data loss, so a member is
believed only with this incarnation's MAC: one a writer added, or copied from before the loss,
is rejected and counted (`registered`), never a reason to admit new holders early."""

from __future__ import annotations

import redis.asyncio as aredis

from shared.fleet.entries import EntryKind, FleetEntries, Why
from shared.fleet.keys import FleetKeys
from shared.fleet.redis_client import guard


class Registrations:
    def __init__(self, client: aredis.Redis, keys: FleetKeys, entries: FleetEntries) -> None:
        self.client = client
        self.keys = keys
        self.entries = entries

    async def add(self, incarnation: str, host_id: str) -> None:
        tag = self.entries.mac(EntryKind.REGISTERED, [incarnation, host_id])
        with guard("fleet registered"):
            await self.client.sadd(self.keys.registered, f"{host_id}:{tag}")

    async def hosts(self, incarnation: str) -> frozenset[str]:
        with guard("fleet registered"):
            members = await self.client.smembers(self.keys.registered)
        hosts = set()
        for member in members:
            host, _sep, tag = member.decode("utf-8", "replace").rpartition(":")
            if self.entries.valid(EntryKind.REGISTERED, [incarnation, host], tag):
                hosts.add(host)
            else:
                self.entries.reject(EntryKind.REGISTERED, self.keys.registered, Why.MAC)
        return frozenset(hosts)
