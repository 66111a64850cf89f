"""`RedisCircuits`: one circuit per account for the whole fleet (SPEC §7, §16).

Each account's `Circuit` is one string, msgpack-encoded; absent means closed. `swap` is a Lua
compare-and-set on the bytes: canonical encoding (a Struct's fields always in their declared
order, every field present) makes equal circuits equal bytes, so comparing bytes compares
states. The comparand is the exact bytes `load` read when the expected state is the one it
read, so a fleet of mixed versions (one encoding a field the other does not know) still
compares what is stored rather than a re-encoding of it. The rules stay in `CircuitRegistry`.
"""

from __future__ import annotations

import msgspec
import redis.asyncio as aredis

from controlplane.core import circuit as rules
from shared.fleet.keys import FleetKeys
from shared.fleet.redis_client import guard

# KEYS: the account's circuit; ARGV: expected bytes, '1' when the expected state is closed
# (absent matches it too), new bytes, '1' when the new state is closed (stored as absent).
SWAP = """
local current = redis.call('GET', KEYS[1])
if current then
  if current ~= ARGV[1] then return 0 end
elseif ARGV[2] ~= '1' then
  return 0
end
if ARGV[4] == '1' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[3]) end
return 1
"""

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(rules.Circuit).decode


def encode_circuit(state: rules.Circuit) -> bytes:
    """Canonical: equal circuits encode to equal bytes (tested)."""
    return _encode(state)


class RedisCircuits:
    """The `CircuitStore` for a fleet."""

    def __init__(self, client: aredis.Redis, keys: FleetKeys) -> None:
        self.client = client
        self.keys = keys
        self._swap = client.register_script(SWAP)
        self._read: dict[str, tuple[rules.Circuit, bytes]] = {}  # account -> last load (one each)

    async def load(self, account_id: str) -> rules.Circuit:
        with guard("circuit load"):
            raw = await self.client.get(self.keys.circuit(account_id))
        if raw is None:
            self._read.pop(account_id, None)
            return rules.CLOSED
        state = _decode(raw)
        self._read[account_id] = (state, raw)
        return state

    async def swap(self, account_id: str, expected: rules.Circuit, new: rules.Circuit) -> bool:
        last = self._read.get(account_id)
        comparand = last[1] if last is not None and last[0] == expected else encode_circuit(expected)
        closed_new = new == rules.CLOSED
        with guard("circuit swap"):
            swapped = await self._swap(keys=[self.keys.circuit(account_id)], args=[
                comparand, "1" if expected == rules.CLOSED else "0",
                b"" if closed_new else encode_circuit(new), "1" if closed_new else "0"])
        return swapped == 1
