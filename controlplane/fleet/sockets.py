"""Each host's open Responses WebSockets per account, for the fleet's accounts view (SPEC §20).

A host's data plane tells its control how many sockets it holds open per account
(`SocketsOpen`); control publishes that with each heartbeat as a hash
`{f}:hosts:sockets:<host>` of account → `<count>.<mac>`, the MAC over (kind, host, account,
count) with the `sockets` entry key (SPEC §19), living twice the host TTL so a dead host's
sockets vanish with it. A reader believes an entry only once its MAC verifies and its count is
an integer >= 0; any other entry is skipped and counted (`FleetEntries.reject`), never a reason
to fail the read plane.
"""

from __future__ import annotations

from collections.abc import Mapping

import redis.asyncio as aredis

from shared.fleet.entries import EntryKind, FleetEntries, Why
from shared.fleet.keys import FleetKeys
from shared.fleet.redis_client import guard

MAX_COUNT = 1_000_000  # no host holds more sockets than connections (GATEWAY_MAX_CONNECTIONS)


class SocketsBoard:
    def __init__(self, client: aredis.Redis, keys: FleetKeys, entries: FleetEntries, ttl_s: float) -> None:
        self.client = client
        self.keys = keys
        self.entries = entries
        self.ttl_ms = int(ttl_s * 2000)

    def entry(self, host_id: str, account_id: str, count: int) -> str:
        return f"{count}.{self.entries.mac(EntryKind.SOCKETS, [host_id, account_id, count])}"

    async def write(self, host_id: str, counts: Mapping[str, int]) -> None:
        key = self.keys.host_sockets(host_id)
        with guard("sockets write"):
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.delete(key)
                live = {a: self.entry(host_id, a, n) for a, n in counts.items() if n > 0}
                if live:
                    pipe.hset(key, mapping=live)
                    pipe.pexpire(key, self.ttl_ms)
                await pipe.execute()

    async def read(self, host_ids: list[str]) -> dict[str, int]:
        """account → sockets open on `host_ids` together (each entry checked)."""
        with guard("sockets read"):
            async with self.client.pipeline(transaction=False) as pipe:
                for host in host_ids:
                    pipe.hgetall(self.keys.host_sockets(host))
                answers = await pipe.execute()
        total: dict[str, int] = {}
        for host, answer in zip(host_ids, answers):
            for account, count in self.counts(host, answer).items():
                total[account] = total.get(account, 0) + count
        return total

    def counts(self, host_id: str, answer: Mapping[bytes, bytes]) -> dict[str, int]:
        """One host's hash, each entry believed only with its MAC and a count in range."""
        key = self.keys.host_sockets(host_id)
        counts: dict[str, int] = {}
        for raw_account, raw in answer.items():
            account = raw_account.decode("utf-8", "replace")
            number, _, presented = raw.decode("ascii", "replace").partition(".")
            digits = number.isascii() and number.isdigit() and len(number) <= 12
            if not digits or int(number) > MAX_COUNT:
                self.entries.reject(EntryKind.SOCKETS, key, Why.RANGE if digits else Why.DECODE)
                continue
            if not self.entries.valid(EntryKind.SOCKETS, [host_id, account, int(number)], presented):
                self.entries.reject(EntryKind.SOCKETS, key, Why.MAC)
                continue
            counts[account] = int(number)
        return counts
