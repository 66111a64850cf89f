"""Dispatch keys (SPEC §17): when the gateway moves a worker's one key to a sibling account.

Pure. A dispatch key (`fallback_driver: "gateway"`) keeps its token for the whole dispatch; the
lease behind it may be replaced by the gateway, never by the worker, and only as SPEC §8 allows:

- `hop_conditions` is what a lease carries to the data plane: the qualifying conditions on
  which an attempt's end starts a hop (the resolved `fallback_on`, while the hop budget has room;
  nothing for a caller-driven lease). The data plane stops admitting attempts on the key the
  moment such an attempt ends (`fallback-pending`), before control has even seen the row.
- `starts_hop` is the same rule, applied by control to the terminal row.
- `hop_may_proceed` says when the pending hop runs: once no attempt of the dispatch is in flight.

The hop itself is a retry citing the lease's decision, decided by `decide_mint` like any other
(every rule of `authorise_fallback`), so a hop can be held or rejected, and then the key stays.
"""

from __future__ import annotations

from enum import StrEnum

from shared.codes import Condition


class FallbackDriver(StrEnum):
    CALLER = "caller"  # the worker revokes, cites and re-mints (SPEC §8); the gateway never moves it
    GATEWAY = "gateway"  # the gateway hops the key for the worker (SPEC §17)


def hop_conditions(
    driver: FallbackDriver, fallback_on: frozenset[Condition], hop: int, max_hops: int
) -> frozenset[Condition]:
    """The conditions on which an attempt on this lease starts a hop (none: never)."""
    if driver != FallbackDriver.GATEWAY or hop + 1 > max_hops:
        return frozenset()
    return fallback_on


def starts_hop(conditions: frozenset[Condition], condition: Condition | None, refusal_reason: str | None) -> bool:
    """Does this terminal start a hop? Only a qualifying upstream answer (never a
    gateway-authored refusal, an abort, a 400 or a 2xx, which carry no condition) whose
    condition the lease hops on."""
    return refusal_reason is None and condition is not None and condition in conditions


def hop_may_proceed(pending: bool, in_flight: int) -> bool:
    """A pending hop runs once no attempt of the dispatch is in flight (never two accounts in
    flight for one dispatch)."""
    return pending and in_flight == 0
