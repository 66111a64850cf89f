"""The hot path's enum shortcuts (issue 27) answer exactly what the tables answer: a clean
end's verdict without hashing the member, and no condition for a completed attempt."""

from __future__ import annotations

import pytest

from dataplane.endings import VERDICTS, Ending, verdict
from shared.codes import AttemptStatus, Refusal
from shared.evidence import condition_for_terminal


@pytest.mark.parametrize("ending", list(Ending))
@pytest.mark.parametrize("complete", [True, False])
def test_verdict_is_the_table(ending: Ending, complete: bool) -> None:
    assert verdict(ending, complete) is VERDICTS[(ending, complete)]


@pytest.mark.parametrize("http_status", [None, 200, 204, 400, 401, 403, 404, 408, 429, 500, 502, 503, 529])
@pytest.mark.parametrize("refusal", [None, *Refusal])
def test_a_completed_attempt_never_qualifies(http_status: int | None, refusal: Refusal | None) -> None:
    # attempt.finish skips condition_for_terminal for a completed attempt: this is why it may
    assert condition_for_terminal(AttemptStatus.COMPLETED, http_status, refusal) is None
