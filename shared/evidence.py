"""`condition_for_terminal` (SPEC §7): what an attempt's terminal says about its account.

Pure. Gateway-authored terminals (a `refusal_reason` is set) and client aborts are never
evidence; 2xx and every 4xx but 401/402/403/429 are the request's business, not the account's.
"""

from __future__ import annotations

from shared.codes import AttemptStatus, Condition

_BY_STATUS: dict[int, Condition] = {
    429: Condition.RATE_LIMITED,
    529: Condition.OVERLOADED,
    402: Condition.CREDIT_EXHAUSTED,
    500: Condition.UPSTREAM_UNAVAILABLE,
    502: Condition.UPSTREAM_UNAVAILABLE,
    503: Condition.UPSTREAM_UNAVAILABLE,
    504: Condition.UPSTREAM_UNAVAILABLE,
    401: Condition.CREDENTIAL_REJECTED,
    403: Condition.CREDENTIAL_REJECTED,
}


# Bound once: an enum member read off its class is a slow class attribute on 3.11 (issue 27).
_CLIENT_ABORTED = AttemptStatus.CLIENT_ABORTED
_TRANSPORT_ERROR = AttemptStatus.TRANSPORT_ERROR
_UPSTREAM_ERROR = AttemptStatus.UPSTREAM_ERROR
_TRANSPORT_CONDITION = Condition.TRANSPORT_ERROR


def condition_for_terminal(status: str | None, http_status: int | None, refusal_reason: str | None) -> Condition | None:
    """The qualifying condition of one terminal row, or None."""
    if refusal_reason is not None or status == _CLIENT_ABORTED:
        return None
    if status == _TRANSPORT_ERROR:
        return _TRANSPORT_CONDITION
    if status == _UPSTREAM_ERROR and http_status is not None:
        return _BY_STATUS.get(http_status)
    return None
