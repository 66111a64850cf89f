"""`verify_chain` by tables: every tamper case reads corrupt with its own reason code."""

from __future__ import annotations

import ast
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from shared.chain import (
    GENESIS_HASH,
    ChainCheck,
    Fault,
    Head,
    Verdict,
    encode_anchor,
    encode_record,
    head_of_tail,
    record_hash,
    seal,
    split_lines,
    verify_chain,
    verify_chain_between,
)

REPO = Path(__file__).resolve().parents[2]


def chain(n: int) -> list[bytes]:
    """n honest records, as lines."""
    lines: list[bytes] = []
    prev = GENESIS_HASH
    for seq in range(1, n + 1):
        record = seal({"account_id": f"acct-{seq}", "state": "disabled", "reason": "r"}, seq, prev)
        lines.append(encode_record(record))
        prev = record["hash"]
    return lines


def head(lines: list[bytes], count: int) -> str | None:
    return json.loads(lines[count - 1])["hash"] if count else None


def anchor_for(lines: list[bytes], count: int | None = None) -> bytes:
    count = len(lines) if count is None else count
    return encode_anchor(count, head(lines, count))


def edit(line: bytes, rehash: bool = False, **changes: object) -> bytes:
    record = json.loads(line)
    record.update(changes)
    if rehash:
        record["hash"] = record_hash(record)
    return encode_record(record)


class Case(msgspec.Struct, frozen=True):
    name: str
    given: Callable[[], tuple[list[bytes], bytes | None]]
    verdict: Verdict
    fault: Fault | None = None
    revision: int | None = None


def _three() -> list[bytes]:
    return chain(3)


CASES = [
    Case("no-chain-no-anchor", lambda: ([], None), Verdict.ABSENT, revision=0),
    Case("seeded-anchor-empty-chain", lambda: ([], encode_anchor(0, None)), Verdict.VERIFIED, revision=0),
    Case("anchored", lambda: (_three(), anchor_for(_three())), Verdict.VERIFIED, revision=3),
    Case("crash-window-one-ahead", lambda: (_three(), anchor_for(_three(), 2)), Verdict.VERIFIED, revision=3),
    Case("crash-window-first-append", lambda: (chain(1), encode_anchor(0, None)), Verdict.VERIFIED, revision=1),
    Case(
        "edited-earlier-record",
        lambda: ([edit(_three()[0], reason="x")] + _three()[1:], anchor_for(_three())),
        Verdict.CORRUPT,
        Fault.HASH_MISMATCH,
    ),
    Case(
        "edited-and-rehashed-earlier-record",
        lambda: ([edit(_three()[0], rehash=True, state="enabled")] + _three()[1:], anchor_for(_three())),
        Verdict.CORRUPT,
        Fault.LINK_BROKEN,
    ),
    Case(
        "swapped-records",
        lambda: ([_three()[0], _three()[2], _three()[1]], anchor_for(_three())),
        Verdict.CORRUPT,
        Fault.LINK_BROKEN,
    ),
    Case(
        "dropped-last-record", lambda: (_three()[:2], anchor_for(_three())), Verdict.CORRUPT, Fault.SHORTER_THAN_ANCHOR
    ),
    Case(
        "dropped-to-seeded-size",
        lambda: (_three()[:1], anchor_for(_three())),
        Verdict.CORRUPT,
        Fault.SHORTER_THAN_ANCHOR,
    ),
    Case(
        "truncated-to-empty-with-anchor", lambda: ([], anchor_for(_three())), Verdict.CORRUPT, Fault.EMPTY_WITH_ANCHOR
    ),
    Case("records-without-anchor", lambda: (_three(), None), Verdict.CORRUPT, Fault.ANCHOR_MISSING),
    Case(
        "torn-final-line",
        lambda: (_three()[:2] + [_three()[2][:40]], anchor_for(_three(), 2)),
        Verdict.CORRUPT,
        Fault.TORN_LINE,
    ),
    Case(
        "final-line-without-newline",
        lambda: (_three()[:2] + [_three()[2][:-1]], anchor_for(_three())),
        Verdict.CORRUPT,
        Fault.TORN_LINE,
    ),
    Case(
        "garbage-middle-line",
        lambda: ([_three()[0], b"not json\n", _three()[2]], anchor_for(_three())),
        Verdict.CORRUPT,
        Fault.TORN_LINE,
    ),
    Case(
        "blank-middle-line",
        lambda: ([_three()[0], b"\n"] + _three()[1:], anchor_for(_three())),
        Verdict.CORRUPT,
        Fault.TORN_LINE,
    ),
    Case("json-but-not-a-record", lambda: ([b"[1, 2]\n"], encode_anchor(0, None)), Verdict.CORRUPT, Fault.TORN_LINE),
    Case(
        "record-without-hash",
        lambda: ([b'{"seq": 1, "prev_hash": "00"}\n'], encode_anchor(0, None)),
        Verdict.CORRUPT,
        Fault.TORN_LINE,
    ),
    Case(
        "anchor-names-another-head",
        lambda: (_three(), encode_anchor(3, "f" * 64)),
        Verdict.CORRUPT,
        Fault.HEAD_MISMATCH,
    ),
    Case(
        "crash-window-anchor-names-another-head",
        lambda: (_three(), encode_anchor(2, "f" * 64)),
        Verdict.CORRUPT,
        Fault.HEAD_MISMATCH,
    ),
    Case("two-past-the-anchor", lambda: (chain(4), anchor_for(chain(4), 2)), Verdict.CORRUPT, Fault.AHEAD_OF_ANCHOR),
    Case("anchor-not-json", lambda: (_three(), b"{nope"), Verdict.CORRUPT, Fault.ANCHOR_UNREADABLE),
    Case(
        "anchor-unknown-field",
        lambda: ([], b'{"count":0,"head_hash":null,"x":1}'),
        Verdict.CORRUPT,
        Fault.ANCHOR_UNREADABLE,
    ),
    Case(
        "anchor-count-zero-with-head",
        lambda: ([], encode_anchor(0, "a" * 64)),
        Verdict.CORRUPT,
        Fault.ANCHOR_UNREADABLE,
    ),
    Case(
        "anchor-negative-count",
        lambda: ([], b'{"count":-1,"head_hash":null}'),
        Verdict.CORRUPT,
        Fault.ANCHOR_UNREADABLE,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_verify_chain(case: Case) -> None:
    lines, anchor = case.given()
    check = verify_chain(lines, anchor)
    assert (check.verdict, check.fault) == (case.verdict, case.fault)
    if case.revision is not None:
        assert check.revision == case.revision == len(check.records)
    if case.verdict is Verdict.CORRUPT:
        assert check.revision is None


def test_record_faults_name_their_line_and_keep_the_verified_prefix() -> None:
    lines = chain(3)
    check = verify_chain([lines[0], edit(lines[1], reason="x"), lines[2]], anchor_for(lines))
    assert (check.fault, check.fault_line) == (Fault.HASH_MISMATCH, 2)
    assert [r["seq"] for r in check.records] == [1]
    assert verify_chain(lines[:2], anchor_for(lines)).fault_line is None


class Between(msgspec.Struct, frozen=True):
    name: str
    records: int
    before: int | None  # anchored count at the first anchor read (None: no anchor file)
    after: int | None  # ... and at the second
    verdict: Verdict
    fault: Fault | None = None


BETWEEN = [
    # A reader raced a commit: the anchor moved on between the two reads.
    Between("commit-landed-after-the-chain-read", 3, 2, 3, Verdict.VERIFIED),
    Between("two-commits-landed-during-the-read", 4, 2, 4, Verdict.VERIFIED),
    Between("anchor-moved-past-the-chain-read", 3, 3, 5, Verdict.VERIFIED),
    Between("seeded-during-the-read", 1, None, 0, Verdict.VERIFIED),
    Between("seeded-and-committed-during-the-read", 1, None, 1, Verdict.VERIFIED),
    # Damage is still damage, whichever anchor read sees it.
    Between("shorter-than-the-earlier-anchor", 2, 3, 4, Verdict.CORRUPT, Fault.SHORTER_THAN_ANCHOR),
    Between("ahead-of-the-later-anchor", 5, 3, 3, Verdict.CORRUPT, Fault.AHEAD_OF_ANCHOR),
    Between("anchor-vanished-during-the-read", 3, 3, None, Verdict.CORRUPT, Fault.ANCHOR_MISSING),
]


@pytest.mark.parametrize("case", BETWEEN, ids=[c.name for c in BETWEEN])
def test_verify_chain_between_two_anchor_reads(case: Between) -> None:
    full = chain(6)
    lines = full[: case.records]
    before = None if case.before is None else anchor_for(full, case.before)
    after = None if case.after is None else anchor_for(full, case.after)
    check = verify_chain_between(lines, before, after)
    assert (check.verdict, check.fault) == (case.verdict, case.fault)


def test_hash_is_sha256_of_sorted_keys_without_hash() -> None:
    record = seal({"b": 1, "a": "x"}, 1, GENESIS_HASH)
    body = {"a": "x", "b": 1, "prev_hash": GENESIS_HASH, "seq": 1}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    assert record["hash"] == hashlib.sha256(canonical).hexdigest()
    assert record_hash(dict(reversed(list(record.items())))) == record["hash"]
    assert seal({"seq": 9, "hash": "x", "prev_hash": "y", "a": 1}, 2, "p")["seq"] == 2


def test_genesis_and_links() -> None:
    lines = chain(2)
    first, second = json.loads(lines[0]), json.loads(lines[1])
    assert first["prev_hash"] == GENESIS_HASH == "0" * 64
    assert second["prev_hash"] == first["hash"] and second["seq"] == 2


def test_split_lines_keeps_a_torn_tail_apart() -> None:
    assert split_lines(b"") == []
    assert split_lines(b"a\nb\n") == [b"a\n", b"b\n"]
    assert split_lines(b"a\nb") == [b"a\n", b"b"]


def test_head_of_tail_reads_the_last_whole_record() -> None:
    lines = chain(3)
    data = b"".join(lines)
    last = json.loads(lines[2])
    assert head_of_tail(data) == Head(seq=3, hash=last["hash"])
    assert head_of_tail(data[5:]) == Head(seq=3, hash=last["hash"])  # a window starting mid-line
    assert head_of_tail(data + b'{"seq": 4, "pr') == Head(seq=3, hash=last["hash"])
    assert head_of_tail(b"") is None


def test_check_is_frozen() -> None:
    with pytest.raises(AttributeError):
        ChainCheck(verdict=Verdict.ABSENT).verdict = Verdict.VERIFIED  # type: ignore[misc]


PURE = ["shared/chain.py", "controlplane/core/overlay.py"]
FORBIDDEN = {
    "asyncio",
    "aiohttp",
    "filelock",
    "structlog",
    "os",
    "socket",
    "time",
    "secrets",
    "shared.logging",
    "shared.clock",
}


@pytest.mark.parametrize("path", PURE)
def test_cores_do_no_io(path: str) -> None:
    tree = ast.parse((REPO / path).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    assert imported, "the import extractor found nothing"
    assert not {m for m in imported if m in FORBIDDEN or m.split(".")[0] in FORBIDDEN}
