"""Circuit transitions by table, and the rules that only ever move retry_at later."""

from __future__ import annotations

from controlplane.core import circuit as c
from shared.codes import CircuitPhase, Condition

COOL = 30
S = 1000


def fail(state, now, condition=Condition.UPSTREAM_UNAVAILABLE, key="k", retry_after=None):
    return c.on_terminal(state, now, key, condition, False, retry_after, COOL)


def test_three_consecutive_failures_open() -> None:
    state = c.CLOSED
    state = fail(state, 0)
    state = fail(state, 1)
    assert state.phase == CircuitPhase.CLOSED and state.consecutive == 2
    state = fail(state, 2)
    assert state.phase == CircuitPhase.OPEN and state.opened_by == Condition.UPSTREAM_UNAVAILABLE
    assert state.retry_at_ms == 2 + COOL * S


def test_success_resets_the_count_and_aborts_do_not() -> None:
    state = fail(fail(c.CLOSED, 0), 1)
    state = c.on_terminal(state, 2, "k", None, True, None, COOL)  # abort: no change
    assert state.consecutive == 2
    state = c.on_terminal(state, 3, "k", None, False, None, COOL)  # success
    assert state == c.CLOSED


def test_one_credit_exhausted_opens() -> None:
    state = fail(c.CLOSED, 0, Condition.CREDIT_EXHAUSTED)
    assert state.phase == CircuitPhase.OPEN and state.opened_by == Condition.CREDIT_EXHAUSTED


def test_retry_after_longer_than_cooldown_is_honoured_and_capped() -> None:
    state = fail(c.CLOSED, 0, Condition.CREDIT_EXHAUSTED, retry_after=120)
    assert state.retry_at_ms == 120 * S
    state = fail(c.CLOSED, 0, Condition.CREDIT_EXHAUSTED, retry_after=10_000)
    assert state.retry_at_ms == c.MAX_OPEN_MS


def test_retry_at_only_moves_later() -> None:
    state = fail(c.CLOSED, 0, Condition.CREDIT_EXHAUSTED, retry_after=300)
    later = fail(state, 10 * S, Condition.RATE_LIMITED, retry_after=5)
    assert later.retry_at_ms == 300 * S
    longer = fail(state, 10 * S, Condition.RATE_LIMITED, retry_after=600)
    assert longer.retry_at_ms == 610 * S


def test_half_open_admits_exactly_one_probe() -> None:
    state = fail(c.CLOSED, 0, Condition.CREDIT_EXHAUSTED)
    assert not c.admits(state, COOL * S - 1)
    at = COOL * S
    assert c.current(state, at).phase == CircuitPhase.HALF_OPEN
    assert c.admits(state, at)
    state = c.on_lease(state, at, "probe")
    assert not c.admits(state, at + 1)
    # the probe lease ends with no terminal: another may probe
    assert c.admits(c.on_lease_ended(state, at + 2, "probe"), at + 2)


def test_probe_success_closes_and_failure_doubles_the_open_time() -> None:
    state = c.on_lease(fail(c.CLOSED, 0, Condition.CREDIT_EXHAUSTED), COOL * S, "probe")
    assert c.on_terminal(state, COOL * S + 5, "probe", None, False, None, COOL) == c.CLOSED
    reopened = fail(state, COOL * S + 5, Condition.RATE_LIMITED, key="probe")
    assert reopened.phase == CircuitPhase.OPEN
    assert reopened.retry_at_ms == COOL * S + 5 + 2 * COOL * S
    # an older lease's answer does not decide the half-open circuit
    assert fail(state, COOL * S + 5, key="older") == c.current(state, COOL * S + 5)


def test_failed_probes_double_up_to_the_cap() -> None:
    state = fail(c.CLOSED, 0, Condition.CREDIT_EXHAUSTED)
    now = 0
    for _ in range(8):
        now = state.retry_at_ms
        state = fail(c.on_lease(state, now, "p"), now, Condition.OVERLOADED, key="p")
    assert state.retry_at_ms - now == c.MAX_OPEN_MS
