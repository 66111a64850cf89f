"""What `lease-decisions.jsonl` keeps (SPEC §5: the decisions of live leases, and of leases ended
within the last hour, survive a control restart), by table over the pure core
(`controlplane/stores/decisionlines.py`): the retention rule at its edges, what a compaction
keeps, and the strict decoding of every kind of line, hostile ones included."""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec
import pytest

from controlplane.core.fallback import Lineage
from controlplane.decisions import Decision
from controlplane.stores.decisionlines import (
    ENDED_KEPT_MS,
    Ended,
    Evidence,
    Kept,
    decode_line,
    encode_line,
    kept_after_end,
    lines_of,
    retain,
)
from shared.codes import Condition, Outcome

HOUR = 3_600_000
NOW = 10 * HOUR


class Case(NamedTuple):
    name: str
    given: Any
    expect: Any


def _d(n: int, key: str) -> Decision:
    return Decision(
        mint_decision_id=f"md_{n}",
        outcome=Outcome.SELECTED,
        lineage=Lineage("d", "r", "m"),
        at_ms=n,
        key_id=key,
        account_id="a",
        fallback_position=0,
    )


def test_the_hour_is_the_specs() -> None:
    assert ENDED_KEPT_MS == HOUR


RETENTION_CASES = [
    Case("ended just now", NOW, True),
    Case("ended 59:59.999 ago", NOW - HOUR + 1, True),
    Case("ended exactly an hour ago", NOW - HOUR, False),
    Case("ended two hours ago", NOW - 2 * HOUR, False),
    Case("a clock stepped back: ended 'in the future'", NOW + 5_000, True),
]


@pytest.mark.parametrize("case", RETENTION_CASES, ids=[c.name for c in RETENTION_CASES])
def test_kept_after_end(case: Case) -> None:
    assert kept_after_end(case.given, NOW) is case.expect


RL, OV = Condition.RATE_LIMITED, Condition.OVERLOADED
RETAIN_CASES = [
    Case(
        "a live key keeps every decision of it (its grant's and its hop's)",
        ([_d(1, "K1"), _d(2, "K1")], {}, {"md_1": [RL]}, {"K1"}),
        Kept(decisions=(_d(1, "K1"), _d(2, "K1")), ended={}, evidence={"md_1": (RL,)}),
    ),
    Case(
        "ended under an hour ago: kept, with its end and its evidence",
        ([_d(1, "K1")], {"K1": NOW - HOUR + 1}, {"md_1": [RL, None]}, set()),
        Kept(decisions=(_d(1, "K1"),), ended={"K1": NOW - HOUR + 1}, evidence={"md_1": (RL, None)}),
    ),
    Case(
        "ended an hour ago or more: dropped, with its end and its evidence",
        ([_d(1, "K1"), _d(2, "K2")], {"K1": NOW - HOUR, "K2": NOW - 2 * HOUR}, {"md_1": [RL]}, set()),
        Kept(decisions=(), ended={}, evidence={}),
    ),
    Case(
        "neither live nor ended (a record whose grant never happened): dropped",
        ([_d(1, "K1")], {}, {}, set()),
        Kept(decisions=(), ended={}, evidence={}),
    ),
    Case(
        "live wins over a stray end",
        ([_d(1, "K1")], {"K1": NOW - 2 * HOUR}, {}, {"K1"}),
        Kept(decisions=(_d(1, "K1"),), ended={}, evidence={}),
    ),
    Case(
        "an end or evidence without its decision is not kept",
        ([], {"K9": NOW}, {"md_9": [OV]}, set()),
        Kept(decisions=(), ended={}, evidence={}),
    ),
    Case(
        "evidence kept is each condition once, in the order it first arrived",
        ([_d(1, "K1")], {}, {"md_1": [None, RL, None, RL, OV]}, {"K1"}),
        Kept(decisions=(_d(1, "K1"),), ended={}, evidence={"md_1": (None, RL, OV)}),
    ),
    Case(
        "the order recorded is kept",
        ([_d(3, "K3"), _d(1, "K1"), _d(2, "K2")], {"K2": NOW - 1}, {}, {"K1", "K3"}),
        Kept(decisions=(_d(3, "K3"), _d(1, "K1"), _d(2, "K2")), ended={"K2": NOW - 1}, evidence={}),
    ),
]


@pytest.mark.parametrize("case", RETAIN_CASES, ids=[c.name for c in RETAIN_CASES])
def test_retain(case: Case) -> None:
    decisions, ended, evidence, live = case.given
    assert retain(decisions, ended, evidence, live, NOW) == case.expect


def test_a_compacted_journal_reads_back_the_same() -> None:
    kept = Kept(decisions=(_d(1, "K1"), _d(2, "K2")), ended={"K2": NOW}, evidence={"md_2": (RL, None, OV)})
    lines = [decode_line(encode_line(line)) for line in lines_of(kept)]
    assert lines == [
        _d(1, "K1"),
        _d(2, "K2"),
        Ended(key_id="K2", at_ms=NOW),
        Evidence(mint_decision_id="md_2", condition=RL),
        Evidence(mint_decision_id="md_2", condition=None),
        Evidence(mint_decision_id="md_2", condition=OV),
    ]


HOSTILE_LINES = [
    Case("torn mid-line", b'{"mint_decision_id": "md_1", "outc', None),
    Case("empty", b"\n", None),
    Case("not JSON", b"\xff\xfe garbage\n", None),
    Case("a JSON array", b"[1, 2]\n", None),
    Case("an unknown mark", b'{"mark": "forged", "key_id": "K1"}\n', None),
    Case("an end without a time", b'{"mark": "ended", "key_id": "K1"}\n', None),
    Case("an end whose time is a string", b'{"mark": "ended", "key_id": "K1", "at_ms": "soon"}\n', None),
    Case(
        "evidence of an unknown condition", b'{"mark": "evidence", "mint_decision_id": "m", "condition": "x"}\n', None
    ),
    Case("a decision of an unknown outcome", encode_line(_d(1, "K1")).replace(b"selected", b"chosen"), None),
]


@pytest.mark.parametrize("case", HOSTILE_LINES, ids=[c.name for c in HOSTILE_LINES])
def test_a_hostile_line_does_not_decode(case: Case) -> None:
    with pytest.raises(msgspec.DecodeError):
        decode_line(case.given)


def test_a_line_written_before_marks_existed_still_decodes() -> None:
    old = (
        b'{"mint_decision_id":"md_1","outcome":"selected","lineage":{"dispatch_id":"d","repo_slug":"r",'
        b'"model":"m"},"at_ms":1,"key_id":"K1"}'
    )
    assert decode_line(old) == Decision(
        mint_decision_id="md_1", outcome=Outcome.SELECTED, lineage=Lineage("d", "r", "m"), at_ms=1, key_id="K1"
    )
