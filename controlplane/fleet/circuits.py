"""`RedisCircuits`: one circuit per account for the whole fleet (SPEC §7, §16), MAC'd (SPEC §19).

Each account's `Circuit` is one string, `[mac, circuit]` in msgpack: the circuit's msgpack bytes
and their MAC (`EntryKind.CIRCUIT`, over the account id and those bytes, so a circuit cannot be
moved to another account); absent means closed. `swap` is a Lua compare-and-set on the bytes:
canonical encoding (a Struct's fields always in their declared order, every field present, and
an HMAC of them) makes equal circuits equal bytes, so comparing bytes compares states. The
comparand is the exact bytes `load` read when the expected state is the one it read, so a fleet
of mixed versions (one encoding a field the other does not know) still compares what is stored
rather than a re-encoding of it. The rules stay in `CircuitRegistry`.

**A stored circuit that does not verify or decode** (SPEC §19: the fleet's store is trusted for
availability, not for integrity) is rejected (`fleet_entry_rejected`, counted as `circuit`) and
read as **open**, never as closed nor absent: a forged "closed" over an open circuit would
otherwise lift a circuit-open hold, and absent reads as closed. It is open since this host first
read those bytes, for `unverified_open_ms` (the fleet's cooldown), then half-open as any open
circuit: the one probe this host then admits is written through `swap`, whose comparand is the
forged bytes themselves, so the host's own next write replaces them with a signed circuit and
the account recovers by the ordinary rules. Reading it as absent-and-counted instead would wave
a forger's "closed" through, and reading it open for ever would hold the account until an
operator deleted the key. A writer without the secret can still delete the key (the account
reads closed, as after a data loss: SPEC §19's denial of service, not a forged state).
"""

from __future__ import annotations

import msgspec
import redis.asyncio as aredis

from controlplane.core import circuit as rules
from shared.clock import now_ms
from shared.codes import CircuitPhase
from shared.fleet.entries import EntryKind, FleetEntries, Why
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

UNVERIFIED_OPEN_MS = 60_000  # how long a circuit that does not verify reads open (then half-open)

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(rules.Circuit).decode
_decode_signed = msgspec.msgpack.Decoder(tuple[str, bytes]).decode  # (mac, the circuit's bytes)


def encode_circuit(state: rules.Circuit) -> bytes:
    """Canonical: equal circuits encode to equal bytes (tested)."""
    return _encode(state)


class RedisCircuits:
    """The `CircuitStore` for a fleet."""

    def __init__(
        self,
        client: aredis.Redis,
        keys: FleetKeys,
        *,
        entries: FleetEntries,
        unverified_open_ms: int = UNVERIFIED_OPEN_MS,
    ) -> None:
        self.client = client
        self.keys = keys
        self.entries = entries  # SPEC §19: what is stored, MAC'd; what is read, checked and counted
        self.unverified_open_ms = unverified_open_ms
        self._swap = client.register_script(SWAP)
        self._read: dict[str, tuple[rules.Circuit, bytes]] = {}  # account -> last load (one each)
        self._unverified: dict[str, tuple[bytes, rules.Circuit]] = {}  # account -> bytes, read as

    def signed(self, account_id: str, state: rules.Circuit) -> bytes:
        payload = encode_circuit(state)
        return _encode((self.entries.mac(EntryKind.CIRCUIT, [account_id, payload]), payload))

    def circuit_of(self, account_id: str, raw: bytes) -> rules.Circuit:
        """The stored bytes → the circuit they hold, or (rejected) the open circuit read instead."""
        verified = self._verified(account_id, raw)
        if isinstance(verified, rules.Circuit):
            return verified
        self.entries.reject(EntryKind.CIRCUIT, self.keys.circuit(account_id), verified)
        return self._read_open(account_id, raw)

    def _verified(self, account_id: str, raw: bytes) -> rules.Circuit | Why:
        try:
            tag, payload = _decode_signed(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return Why.DECODE
        if not self.entries.valid(EntryKind.CIRCUIT, [account_id, payload], tag):
            return Why.MAC
        try:
            return _decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return Why.DECODE

    def _read_open(self, account_id: str, raw: bytes) -> rules.Circuit:
        """Open since this host first read these bytes (the same state while they stay)."""
        held = self._unverified.get(account_id)
        if held is not None and held[0] == raw:
            return held[1]
        at = now_ms()
        state = rules.Circuit(
            phase=CircuitPhase.OPEN,
            opened_at_ms=at,
            retry_at_ms=at + self.unverified_open_ms,
            open_ms=self.unverified_open_ms,
        )
        self._unverified[account_id] = (raw, state)
        return state

    async def load(self, account_id: str) -> rules.Circuit:
        with guard("circuit load"):
            raw = await self.client.get(self.keys.circuit(account_id))
        if raw is None:
            self._read.pop(account_id, None)
            self._unverified.pop(account_id, None)
            return rules.CLOSED
        state = self.circuit_of(account_id, raw)
        if self._unverified.get(account_id, (None,))[0] != raw:
            self._unverified.pop(account_id, None)
        self._read[account_id] = (state, raw)
        return state

    async def swap(self, account_id: str, expected: rules.Circuit, new: rules.Circuit) -> bool:
        last = self._read.get(account_id)
        comparand = last[1] if last is not None and last[0] == expected else self.signed(account_id, expected)
        closed_new = new == rules.CLOSED
        with guard("circuit swap"):
            swapped = await self._swap(
                keys=[self.keys.circuit(account_id)],
                args=[
                    comparand,
                    "1" if expected == rules.CLOSED else "0",
                    b"" if closed_new else self.signed(account_id, new),
                    "1" if closed_new else "0",
                ],
            )
        return swapped == 1
