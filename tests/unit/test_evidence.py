"""`condition_for_terminal` by one table (SPEC §7): every row of the spec's table, and the
gateway-authored terminals, which are never evidence whatever status they carry."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from shared.codes import HTTP_STATUS, AttemptStatus, Condition, Refusal
from shared.evidence import condition_for_terminal


class Case(NamedTuple):
    name: str
    given: tuple[AttemptStatus, int | None, Refusal | None]  # (status, http_status, refusal_reason)
    expect: Condition | None


UPSTREAM = AttemptStatus.UPSTREAM_ERROR
TRANSPORT = AttemptStatus.TRANSPORT_ERROR
# SPEC §7's gateway-authored terminals, and the data plane's own failure (SPEC §12).
GATEWAY_AUTHORED = (
    Refusal.REQUEST_CAPACITY_EXHAUSTED,
    Refusal.CONTROL_UNAVAILABLE,
    Refusal.POOL_TIMEOUT,
    Refusal.BODY_TOO_LARGE,
    Refusal.PATH_NOT_SERVED,
    Refusal.GATEWAY_SHUTDOWN,
    Refusal.OBSERVATION_STORAGE_UNAVAILABLE,
    Refusal.INTERNAL_ERROR,
    Refusal.MODEL_NOT_PERMITTED,
)

CASES = [
    # the upstream answered: its status decides
    Case("429", (UPSTREAM, 429, None), Condition.RATE_LIMITED),
    Case("529", (UPSTREAM, 529, None), Condition.OVERLOADED),
    Case("402", (UPSTREAM, 402, None), Condition.CREDIT_EXHAUSTED),
    *(Case(str(code), (UPSTREAM, code, None), Condition.UPSTREAM_UNAVAILABLE) for code in (500, 502, 503, 504)),
    Case("401", (UPSTREAM, 401, None), Condition.CREDENTIAL_REJECTED),
    Case("403", (UPSTREAM, 403, None), Condition.CREDENTIAL_REJECTED),
    *(Case(f"{code} is the request's fault", (UPSTREAM, code, None), None) for code in (400, 404, 408, 409, 413, 422)),
    Case("a 3xx passed through", (UPSTREAM, 307, None), None),
    Case("an upstream error without a status", (UPSTREAM, None, None), None),
    Case("2xx", (AttemptStatus.COMPLETED, 200, None), None),
    Case("2xx created", (AttemptStatus.COMPLETED, 201, None), None),
    # no usable answer: connect or read failure, reset, timeout, stream cut before its terminal event
    Case("stream cut after a 200", (TRANSPORT, 200, None), Condition.TRANSPORT_ERROR),
    Case("unreachable 502", (TRANSPORT, 502, None), Condition.TRANSPORT_ERROR),
    Case("upstream timeout 504", (TRANSPORT, 504, None), Condition.TRANSPORT_ERROR),
    Case("unreachable before any status", (TRANSPORT, None, None), Condition.TRANSPORT_ERROR),
    # the worker went away
    Case("client abort", (AttemptStatus.CLIENT_ABORTED, 200, None), None),
    Case("client abort before headers", (AttemptStatus.CLIENT_ABORTED, None, None), None),
    # gateway-authored: never evidence about an account
    *(
        Case(f"gateway-authored {code}", (AttemptStatus.REFUSED, HTTP_STATUS[code], code), None)
        for code in GATEWAY_AUTHORED
    ),
    Case("gateway shutdown cut mid-stream", (TRANSPORT, 200, Refusal.GATEWAY_SHUTDOWN), None),
    Case("a refusal wins over an upstream-looking 429", (UPSTREAM, 429, Refusal.REQUEST_CAPACITY_EXHAUSTED), None),
    Case("a refusal wins over an upstream-looking 503", (UPSTREAM, 503, Refusal.POOL_TIMEOUT), None),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_condition_for_terminal(case: Case) -> None:
    assert condition_for_terminal(*case.given) == case.expect


def test_the_table_reaches_every_condition() -> None:
    assert {case.expect for case in CASES} == {*Condition, None}
