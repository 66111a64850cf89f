"""`SentEvidence` (issue 27 §4): a condition counts as in a decision's evidence only once noted,
for `refresh_s`; forgotten per decision, all at once, and past its bound."""

from __future__ import annotations

from controlplane.fleet.sentevidence import SentEvidence
from shared.codes import Condition


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_noted_condition_is_fresh_until_its_refresh() -> None:
    clock = Clock()
    sent = SentEvidence(refresh_s=30, clock=clock)
    assert not sent.fresh("md_1", None)  # never noted: sent
    sent.note("md_1", None)
    assert sent.fresh("md_1", None) and sent.skipped == 1
    assert not sent.fresh("md_1", Condition.OVERLOADED)  # another condition: sent
    assert not sent.fresh("md_2", None)  # another decision: sent
    clock.now += 29.9
    assert sent.fresh("md_1", None)
    clock.now += 0.1
    assert not sent.fresh("md_1", None)  # refreshed: sent again
    assert sent.skipped == 2


def test_forgetting() -> None:
    sent = SentEvidence(clock=Clock())
    sent.note("md_1", None)
    sent.note("md_2", Condition.RATE_LIMITED)
    sent.forget("md_1")
    assert not sent.fresh("md_1", None) and sent.fresh("md_2", Condition.RATE_LIMITED)
    sent.forget_all()
    assert not sent.fresh("md_2", Condition.RATE_LIMITED)


def test_past_its_bound_every_note_is_forgotten() -> None:
    sent = SentEvidence(max_decisions=3, clock=Clock())
    for n in range(3):
        sent.note(f"md_{n}", None)
    sent.note("md_0", Condition.OVERLOADED)  # a known decision: no new entry
    assert all(sent.fresh(f"md_{n}", None) for n in range(3))
    sent.note("md_3", None)  # a fourth decision: the rest forgotten
    assert sent.fresh("md_3", None) and not any(sent.fresh(f"md_{n}", None) for n in range(3))
