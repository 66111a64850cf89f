"""An append-only, hash-linked, anchored JSONL chain: an audit log that *is* a state.

Rule: a chain is believed only when every record hashes to itself, links to the one before it,
and the whole agrees with its anchor. Anything else is `corrupt`, and a corrupt chain is never
extended. Used by the account-admin overlay (SPEC §9) and the routing policy store (SPEC §10).

File shapes:
- the chain, one JSON object a line, each with `seq` (1, 2, ...), `prev_hash` (the previous
  record's `hash`, `GENESIS_HASH` for the first) and `hash` = sha256 hex of the record *without*
  `hash`, encoded canonically (msgspec JSON, keys sorted);
- the anchor, `{"count": n, "head_hash": h}`, replaced atomically after every append and seeded
  `{"count": 0, "head_hash": null}` before the first one. Forward verification alone cannot see
  trailing records deleted (the shorter chain links perfectly); the anchor is the monotonicity
  witness that can. It holds no state, so one mutation is still exactly one append.

The crash window runs the safe way: the anchor is written after the append, so a crash leaves
the chain one record ahead of its anchor, which reads `verified` and is re-anchored by the next
commit. A coherent rewrite of both files is not detected by hashes alone: in fleet mode (SPEC
§19) every record also carries `mac` = HMAC(chain key, `hash`), outside what `hash` covers, and
a `ChainAuth` makes a record whose MAC does not verify a fault (`mac-mismatch`). Records before
the last `seal` record that verifies need none (a chain from before fleet mode, or from before a
secret's rotation, adopted by that seal, whose MAC covers the head it adopts).

This module is the pure core: bytes in, a `ChainCheck` out, no I/O, tested by tables.
`shared.chainfile.HashChain` is the file shell around it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Any

import msgspec

GENESIS_HASH = "0" * 64
SEAL_ACTION = "seal"  # the record that adopts a chain's records before it (SPEC §19)


class Verdict(StrEnum):
    ABSENT = "absent"  # no chain and no anchor: nothing was ever recorded
    VERIFIED = "verified"
    CORRUPT = "corrupt"


class Fault(StrEnum):
    """Why a chain reads `corrupt`."""

    HASH_MISMATCH = "hash-mismatch"  # a record's content does not hash to its `hash`
    LINK_BROKEN = "link-broken"  # a record's `seq` or `prev_hash` does not follow its predecessor
    TORN_LINE = "torn-line"  # a line that is not one whole record (unterminated, or not JSON)
    SHORTER_THAN_ANCHOR = "shorter-than-anchor"  # trailing records were dropped
    HEAD_MISMATCH = "head-mismatch"  # the record the anchor names has another hash
    AHEAD_OF_ANCHOR = "ahead-of-anchor"  # more than the one-record crash window past the anchor
    ANCHOR_MISSING = "anchor-missing"  # records without an anchor
    ANCHOR_UNREADABLE = "anchor-unreadable"  # an anchor file that is not an anchor
    EMPTY_WITH_ANCHOR = "empty-with-anchor"  # an empty chain whose anchor counts records
    UNREADABLE = "unreadable"  # a file could not be read at all (I/O error)
    MAC_MISMATCH = "mac-mismatch"  # fleet mode: a record's `mac` is missing or does not verify


class Anchor(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    count: int
    head_hash: str | None


class Head(msgspec.Struct, frozen=True):
    seq: int
    hash: str


class ChainCheck(msgspec.Struct, frozen=True, kw_only=True):
    """One verification of one read: the verdict and the records it covers."""

    verdict: Verdict
    fault: Fault | None = None
    fault_line: int | None = None  # 1-based line of a record fault (None for anchor faults)
    records: tuple[dict[str, Any], ...] = ()  # every record that verified, in order
    head_hash: str | None = None  # `hash` of the last record in `records`

    @property
    def revision(self) -> int | None:
        """Record count, or None when the chain cannot be believed."""
        return None if self.verdict is Verdict.CORRUPT else len(self.records)


class ChainAuth:
    """One chain's key (SPEC §19): what makes and checks each record's `mac`.

    `seal_fields`, when given, says this host may adopt a chain whose records do not verify
    (see `HashChain.adopt`): the fields of its audited `seal` record (who, when, why)."""

    def __init__(
        self, key: bytes, seal_fields: Callable[[], dict[str, Any]] | None = None, verify_also: Sequence[bytes] = ()
    ) -> None:
        self._key = key
        self._keys = (key, *verify_also)  # a rotation's other key verifies too, never MACs
        self.seal_fields = seal_fields

    def mac(self, record: Mapping[str, Any]) -> str:
        from shared.fleet.secret import mac  # fleet mode only: an embedded chain has no MACs

        return mac(self._key, [record["hash"]])

    def valid(self, record: Mapping[str, Any]) -> bool:
        from shared.fleet.secret import verify  # fleet mode only

        return verify(self._keys, [record["hash"]], record.get("mac"))

    def __repr__(self) -> str:
        return "ChainAuth(<redacted>)"


def authenticate(records: Sequence[dict[str, Any]], auth: ChainAuth) -> int | None:
    """The index of the first record whose MAC does not verify, or None. Records up to the last
    `seal` record that verifies are covered by it (their hashes link to it)."""
    start = 0
    for index in range(len(records) - 1, -1, -1):
        if records[index].get("action") == SEAL_ACTION and auth.valid(records[index]):
            start = index + 1
            break
    for index in range(start, len(records)):
        if not auth.valid(records[index]):
            return index
    return None


_encode_sorted = msgspec.json.Encoder(order="sorted").encode
_decode_any = msgspec.json.Decoder().decode
_decode_anchor = msgspec.json.Decoder(Anchor).decode
_decode_head = msgspec.json.Decoder(Head).decode


def record_hash(record: Mapping[str, Any]) -> str:
    """sha256 hex of the canonical encoding of `record` without its `hash` and `mac` fields."""
    body = {k: v for k, v in record.items() if k not in ("hash", "mac")}
    return hashlib.sha256(_encode_sorted(body)).hexdigest()


def seal(fields: Mapping[str, Any], seq: int, prev_hash: str) -> dict[str, Any]:
    """The record that follows a chain of `seq - 1` records whose head is `prev_hash`."""
    record = {k: v for k, v in fields.items() if k not in ("seq", "prev_hash", "hash", "mac")}
    record["seq"] = seq
    record["prev_hash"] = prev_hash
    record["hash"] = record_hash(record)
    return record


def encode_record(record: Mapping[str, Any]) -> bytes:
    return _encode_sorted(record) + b"\n"


def encode_anchor(count: int, head_hash: str | None) -> bytes:
    return _encode_sorted(Anchor(count=count, head_hash=head_hash))


def split_lines(data: bytes) -> list[bytes]:
    """Lines each keeping its `\\n`; a final line without one is kept as it is (torn)."""
    lines = data.split(b"\n")
    tail = lines.pop()
    out = [line + b"\n" for line in lines]
    if tail:
        out.append(tail)
    return out


class _Unreadable:
    pass


_UNREADABLE = _Unreadable()


def _anchor_of(data: bytes | None) -> Anchor | None | _Unreadable:
    if data is None:
        return None
    try:
        anchor = _decode_anchor(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return _UNREADABLE
    if anchor.count < 0 or (anchor.count == 0) != (anchor.head_hash is None):
        return _UNREADABLE
    return anchor


def _record_of(line: bytes) -> dict[str, Any] | None:
    try:
        record = _decode_any(line)
    except msgspec.DecodeError:
        return None
    if not isinstance(record, dict):
        return None
    seq, prev, digest = record.get("seq"), record.get("prev_hash"), record.get("hash")
    if type(seq) is not int or not isinstance(prev, str) or not isinstance(digest, str):
        return None
    return record


def _walk(lines: Sequence[bytes]) -> tuple[list[dict[str, Any]], Fault | None, int | None]:
    """Hash and link every record from the genesis; stop at the first fault."""
    records: list[dict[str, Any]] = []
    prev = GENESIS_HASH
    for number, line in enumerate(lines, 1):
        record = _record_of(line) if line.endswith(b"\n") else None
        if record is None:
            return records, Fault.TORN_LINE, number
        if record_hash(record) != record["hash"]:
            return records, Fault.HASH_MISMATCH, number
        if record["seq"] != number or record["prev_hash"] != prev:
            return records, Fault.LINK_BROKEN, number
        records.append(record)
        prev = record["hash"]
    return records, None, None


def _anchor_fault(
    records: Sequence[Mapping[str, Any]], before: bytes | None, after: bytes | None
) -> tuple[Verdict, Fault | None]:
    a, b = _anchor_of(before), _anchor_of(after)
    if isinstance(a, _Unreadable) or isinstance(b, _Unreadable):
        return Verdict.CORRUPT, Fault.ANCHOR_UNREADABLE
    n = len(records)
    if a is None and b is None:
        return (Verdict.ABSENT, None) if n == 0 else (Verdict.CORRUPT, Fault.ANCHOR_MISSING)
    if b is None:  # there a moment ago and gone now: writers replace the anchor, never remove it
        return Verdict.CORRUPT, Fault.ANCHOR_MISSING
    # No anchor at the first look but one at the second: a writer seeded it in between, so
    # nothing had been anchored yet.
    lower = a if a is not None else Anchor(count=0, head_hash=None)
    if n == 0 and lower.count > 0:
        return Verdict.CORRUPT, Fault.EMPTY_WITH_ANCHOR
    if n < lower.count:
        return Verdict.CORRUPT, Fault.SHORTER_THAN_ANCHOR
    for anchor in (lower, b):
        if 0 < anchor.count <= n and records[anchor.count - 1]["hash"] != anchor.head_hash:
            return Verdict.CORRUPT, Fault.HEAD_MISMATCH
    if n > b.count + 1:
        return Verdict.CORRUPT, Fault.AHEAD_OF_ANCHOR
    return Verdict.VERIFIED, None


def verify_chain_between(
    lines: Sequence[bytes], anchor_before: bytes | None, anchor_after: bytes | None, auth: ChainAuth | None = None
) -> ChainCheck:
    """Verify chain `lines` read between two reads of its anchor (raw bytes, None = no file).

    The anchor only moves forward and never lags the chain by more than the crash window, so
    the earlier anchor bounds the chain from below (it may not be shorter, and must contain the
    anchored head) and the later one from above (at most one record past it). A reader that
    raced a commit therefore never mistakes the race for damage; with no commit in between the
    two anchors are equal and this is the plain single-anchor check. With `auth` (fleet mode)
    a record whose MAC does not verify is a fault too, and ends the believed records there.
    """
    records, fault, line = _walk(lines)
    if fault is None and auth is not None:
        bad = authenticate(records, auth)
        if bad is not None:
            fault, line, records = Fault.MAC_MISMATCH, bad + 1, records[:bad]
    head = records[-1]["hash"] if records else None
    if fault is not None:
        return ChainCheck(verdict=Verdict.CORRUPT, fault=fault, fault_line=line, records=tuple(records), head_hash=head)
    verdict, fault = _anchor_fault(records, anchor_before, anchor_after)
    return ChainCheck(verdict=verdict, fault=fault, records=tuple(records), head_hash=head)


def verify_chain(lines: Sequence[bytes], anchor: bytes | None, auth: ChainAuth | None = None) -> ChainCheck:
    """Verify chain `lines` against one anchor read (raw bytes, None = no anchor file)."""
    return verify_chain_between(lines, anchor, anchor, auth)


def head_of_tail(tail: bytes) -> Head | None:
    """The last whole record's `(seq, hash)` in the tail of a chain, unverified."""
    lines = split_lines(tail)
    for line in reversed(lines):
        if line.endswith(b"\n"):
            try:
                return _decode_head(line)
            except (msgspec.DecodeError, msgspec.ValidationError):
                return None
    return None
