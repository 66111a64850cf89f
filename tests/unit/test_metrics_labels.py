"""`row_labels` by table: every label value comes from a closed vocabulary (SPEC §11)."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

from controlplane.rowcounts import RowLabels, row_labels

KNOWN = frozenset({"legacy-anthropic", "team-b"})


class Case(NamedTuple):
    name: str
    given: dict[str, Any]
    expect: RowLabels


def given(**changes: Any) -> dict[str, Any]:
    base = {
        "account_id": "team-b",
        "wire": "anthropic",
        "status": "completed",
        "condition": None,
        "refusal_reason": None,
    }
    return {**base, **changes}


def labels(**changes: str | None) -> RowLabels:
    base = {"account_id": "team-b", "wire": "anthropic", "status": "completed", "condition": "none", "refusal": None}
    return RowLabels(**{**base, **changes})


CASES = [
    Case("completed", given(), labels()),
    Case(
        "qualifying failure",
        given(status="upstream-error", condition="rate-limited"),
        labels(status="upstream-error", condition="rate-limited"),
    ),
    Case(
        "gateway refusal",
        given(status="refused", refusal_reason="body-too-large"),
        labels(status="refused", refusal="body-too-large"),
    ),
    Case("unknown account is not a new series", given(account_id="01KEYIDLOOKINGTHING"), labels(account_id="other")),
    Case("unknown wire", given(wire="grpc"), labels(wire="other")),
    Case("unknown status", given(status="exploded"), labels(status="other")),
    Case("unknown condition", given(condition="sk-ant-api03-xyz"), labels(condition="other")),
    Case(
        "unknown refusal",
        given(status="refused", refusal_reason="lhgw_01ABC.secret"),
        labels(status="refused", refusal="other"),
    ),
    Case("no status yet", given(status=None), labels(status="none")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_row_labels(case: Case) -> None:
    assert row_labels(known_accounts=KNOWN, **case.given) == case.expect
