"""Chains authenticate their records (SPEC §19), by tables: `mac` = HMAC(chain key, `hash`), outside
what `hash` covers; a record whose MAC is missing or wrong is `mac-mismatch`; records before the
last `seal` that verifies are covered by it; a forged seal covers nothing."""

from __future__ import annotations

from typing import Any

import pytest

from shared.chain import (
    GENESIS_HASH,
    SEAL_ACTION,
    ChainAuth,
    Fault,
    Verdict,
    encode_anchor,
    encode_record,
    record_hash,
    seal,
    verify_chain,
)
from shared.fleet.secret import FleetSecret

AUTH = ChainAuth(FleetSecret(b"k" * 32).key("f", "chain/account-admin"))
OTHER = ChainAuth(FleetSecret(b"o" * 32).key("f", "chain/account-admin"))  # a Redis writer's guess


def build(specs: list[str]) -> list[dict[str, Any]]:
    """Each spec: `m` a record MAC'd with AUTH, `-` without a MAC, `x` MAC'd with OTHER, `s` a
    seal MAC'd with AUTH, `S` a seal MAC'd with OTHER."""
    records: list[dict[str, Any]] = []
    for spec in specs:
        prev = records[-1]["hash"] if records else GENESIS_HASH
        fields = (
            {"action": SEAL_ACTION, "adopts_hash": prev} if spec in "sS" else {"action": "set-state", "n": len(records)}
        )
        record = seal(fields, len(records) + 1, prev)
        if spec in "ms":
            record["mac"] = AUTH.mac(record)
        elif spec in "xS":
            record["mac"] = OTHER.mac(record)
        records.append(record)
    return records


def check(specs: list[str]) -> tuple[Verdict, Fault | None, int | None]:
    records = build(specs)
    lines = [encode_record(r) for r in records]
    anchor = encode_anchor(len(records), records[-1]["hash"] if records else None)
    result = verify_chain(lines, anchor, AUTH)
    return result.verdict, result.fault, result.fault_line


CASES = [
    ("every record MAC'd", "mmm", (Verdict.VERIFIED, None, None)),
    ("one record without a MAC", "m-m", (Verdict.CORRUPT, Fault.MAC_MISMATCH, 2)),
    ("one record MAC'd by a forger", "mmx", (Verdict.CORRUPT, Fault.MAC_MISMATCH, 3)),
    ("an embedded chain, never sealed", "---", (Verdict.CORRUPT, Fault.MAC_MISMATCH, 1)),
    ("an embedded chain, sealed", "---sm", (Verdict.VERIFIED, None, None)),
    ("a rotated secret's records, sealed", "xxsm", (Verdict.VERIFIED, None, None)),
    ("a record after the seal without a MAC", "--sm-", (Verdict.CORRUPT, Fault.MAC_MISMATCH, 5)),
    ("a forged seal covers nothing", "--S", (Verdict.CORRUPT, Fault.MAC_MISMATCH, 1)),
    ("a forged seal after a real one", "-smS-", (Verdict.CORRUPT, Fault.MAC_MISMATCH, 4)),
    ("the last real seal counts", "-s-s", (Verdict.VERIFIED, None, None)),
]


@pytest.mark.parametrize("name,specs,expected", CASES, ids=[c[0] for c in CASES])
def test_macs_by_table(name: str, specs: str, expected: tuple[Verdict, Fault | None, int | None]) -> None:
    assert check(list(specs)) == expected


def test_the_mac_is_outside_what_the_hash_covers() -> None:
    record = build(["m"])[0]
    assert record_hash(record) == record["hash"] == record_hash({k: v for k, v in record.items() if k != "mac"})
    assert AUTH.valid(record) and not OTHER.valid(record)


def test_without_auth_the_embedded_check_is_unchanged() -> None:
    records = build(list("-x-"))
    lines = [encode_record(r) for r in records]
    assert verify_chain(lines, encode_anchor(3, records[-1]["hash"])).verdict is Verdict.VERIFIED


def test_a_forged_record_with_a_recomputed_hash_is_caught() -> None:
    records = build(list("mm"))
    forged = seal(
        {
            "action": "set-state",
            "account_id": "a",
            "state": "enabled",
            "actor": "alice",
            "actor_authenticated_by": "control-token",
        },
        3,
        records[-1]["hash"],
    )
    forged["mac"] = "A" * 43
    lines = [encode_record(r) for r in (*records, forged)]
    result = verify_chain(lines, encode_anchor(3, forged["hash"]), AUTH)
    assert (result.verdict, result.fault, result.fault_line, len(result.records)) == (
        Verdict.CORRUPT,
        Fault.MAC_MISMATCH,
        3,
        2,
    )
