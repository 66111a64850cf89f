"""What the fleet's decision table writes, MAC'd, and what it reads, checked (SPEC §19).

A decision is stored as `[mac, decision]` (the MAC over its id and its msgpack bytes); an
evidence item or a refused outcome as `<value>:<mac>` (the MAC binds it to its decision). A read
that does not verify or decode is rejected (`shared/fleet/entries.py`: logged once, counted as
`decision`) and answered as absent.
"""

from __future__ import annotations

import msgspec

from controlplane.decisions import Decision
from shared.fleet.entries import EntryKind, FleetEntries, Why
from shared.fleet.keys import FleetKeys

encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Decision).decode
_decode_signed = msgspec.msgpack.Decoder(tuple[str, bytes]).decode  # (mac, the decision's bytes)


class SignedDecisions:
    def __init__(self, keys: FleetKeys, entries: FleetEntries) -> None:
        self.keys = keys
        self.entries = entries

    def signed(self, decision: Decision) -> bytes:
        payload = encode(decision)
        return encode((self.entries.mac(EntryKind.DECISION, [decision.mint_decision_id, payload]), payload))

    def decision_of(self, mint_decision_id: str, raw: bytes | None) -> Decision | None:
        if raw is None:
            return None
        where = self.keys.decision(mint_decision_id)
        try:
            tag, payload = _decode_signed(raw)
            decision = _decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.entries.reject(EntryKind.DECISION, where, Why.DECODE)
            return None
        if not self.entries.valid(EntryKind.DECISION, [mint_decision_id, payload], tag):
            self.entries.reject(EntryKind.DECISION, where, Why.MAC)
            return None
        if decision.mint_decision_id != mint_decision_id:
            self.entries.reject(EntryKind.DECISION, where, Why.RANGE)
            return None
        return decision

    def tagged(self, mint_decision_id: str, value: str) -> str:
        """An evidence item or a refused outcome: `<value>:<mac>` (the MAC binds it to its decision)."""
        return value + ":" + self.entries.mac(EntryKind.DECISION, [mint_decision_id, value])

    def untagged(self, mint_decision_id: str, raw: bytes, where: str) -> str | None:
        value, _sep, tag = raw.decode("utf-8", "replace").rpartition(":")
        if not self.entries.valid(EntryKind.DECISION, [mint_decision_id, value], tag):
            self.entries.reject(EntryKind.DECISION, where, Why.MAC)
            return None
        return value
