"""The row-fed instruments of control's metrics (SPEC §11): each terminal row the service
records (`RowCounts.add`, one of `ControlService.row_sinks`) reduced at once to bounded label
values and numbers, rendered as Prometheus families at scrape time (`RowCollector`).

Labels are account ids, wire, status, condition and code — each a closed vocabulary or the
registry's own account ids; a value outside its vocabulary is counted as `other` rather than
minting a new series (`row_labels`). Never a key id, principal, repo or anything secret.
prometheus-client is imported at the first scrape (`collect`), not at start (issue 27).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator
from functools import cache
from typing import TYPE_CHECKING

import msgspec

from shared.codes import AttemptStatus, Condition, Refusal, Wire
from shared.wire import AttemptRow

if TYPE_CHECKING:
    from prometheus_client.core import Metric

OTHER = "other"
NONE = "none"
# The data plane's own time before the first upstream byte: sub-millisecond to a few seconds.
OVERHEAD_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
TOKEN_KINDS = ("input", "output", "cache_read", "cache_creation")
_WIRES = frozenset(str(w) for w in Wire)
_STATUSES = frozenset(str(s) for s in AttemptStatus)
CONDITIONS = frozenset(str(c) for c in Condition)
_REFUSALS = frozenset(str(r) for r in Refusal)


class RowLabels(msgspec.Struct, frozen=True, kw_only=True):
    account_id: str
    wire: str
    status: str
    condition: str
    refusal: str | None


REFUSAL_CODES = frozenset(str(r) for r in Refusal)


@cache
def bucket_names() -> tuple[str, ...]:
    """The overhead histogram's `le` values, as the exposition spells them."""
    from prometheus_client.utils import floatToGoString

    return (*(floatToGoString(b) for b in OVERHEAD_BUCKETS_S), "+Inf")


def bounded(value: str | None, allowed: Iterable[str], absent: str = NONE) -> str:
    if value is None:
        return absent
    return value if value in allowed else OTHER


def row_labels(
    account_id: str,
    wire: str,
    status: str | None,
    condition: str | None,
    refusal_reason: str | None,
    known_accounts: frozenset[str],
) -> RowLabels:
    """The label values one terminal row counts under, each from a closed vocabulary."""
    return RowLabels(
        account_id=bounded(account_id, known_accounts),
        wire=bounded(wire, _WIRES),
        status=bounded(status, _STATUSES),
        condition=bounded(condition, CONDITIONS),
        refusal=None if refusal_reason is None else bounded(refusal_reason, _REFUSALS),
    )


class _Slot:
    """What one raw (account, wire, status, condition, refusal) key counts into: the cells of its
    bounded labels, shared with every raw key bounded to the same ones. A cell of a family the
    key has not counted in yet is looked up at its first use, so series appear as they did."""

    __slots__ = ("account", "wire", "attempts", "refusal", "tokens", "cost", "unpriced", "overhead")

    def __init__(self, account: str, wire: str, attempts: list[int], refusal: list[int] | None) -> None:
        self.account = account
        self.wire = wire
        self.attempts = attempts
        self.refusal = refusal
        self.tokens: list[int] | None = None
        self.cost: list[float] | None = None
        self.unpriced: list[int] | None = None
        self.overhead: list[float] | None = None


class RowCounts:
    """What the row-fed instruments count, kept as plain numbers and rendered at scrape time.

    One terminal row costs one dict lookup and a few additions here instead of eight prometheus
    `labels()` lookups and locked increments (this runs once per attempt on the data plane's
    core). Each series is keyed by a tuple of bounded label values (`row_labels`), so the series
    are as closed as the vocabularies; a row's raw values find their series' cells through a
    memo (`_Slot`), cleared when it grows past `MEMO_MAX` (the cells stay with their series).
    """

    MEMO_MAX = 4096

    def __init__(self, accounts: frozenset[str]) -> None:
        self.accounts = accounts
        # Each value a one-item list (a cell the slots share), rendered as its item.
        self.attempts: dict[tuple[str, str, str, str], list[int]] = {}
        self.refusals: dict[str, list[int]] = {}
        self.tokens: dict[str, list[int]] = {}  # account → one total per TOKEN_KINDS
        self.cost: dict[str, list[float]] = {}
        self.unpriced: dict[str, list[int]] = {}
        self.overhead: dict[str, list[float]] = {}  # wire → bucket counts (+Inf last), then sum
        self._slots: dict[tuple[str, str, str | None, str | None, str | None], _Slot] = {}

    def _slot(self, key: tuple[str, str, str | None, str | None, str | None]) -> _Slot:
        if len(self._slots) >= self.MEMO_MAX:
            self._slots.clear()
        labels = row_labels(*key, self.accounts)
        series = (labels.account_id, labels.wire, labels.status, labels.condition)
        attempts = self.attempts.get(series)
        if attempts is None:
            attempts = self.attempts[series] = [0]
        refusal = None
        if labels.refusal is not None:
            refusal = self.refusals.get(labels.refusal)
            if refusal is None:
                refusal = self.refusals[labels.refusal] = [0]
        slot = self._slots[key] = _Slot(labels.account_id, labels.wire, attempts, refusal)
        return slot

    def add(self, row: AttemptRow) -> None:
        slot = self._slots.get((row.account_id, row.wire, row.status, row.condition, row.refusal_reason))
        if slot is None:
            slot = self._slot((row.account_id, row.wire, row.status, row.condition, row.refusal_reason))
        slot.attempts[0] += 1
        if slot.refusal is not None:
            slot.refusal[0] += 1
        usage = row.usage
        if usage is not None:
            totals = slot.tokens
            if totals is None:
                totals = slot.tokens = self.tokens.setdefault(slot.account, [0, 0, 0, 0])
            totals[0] += usage.input_tokens
            totals[1] += usage.output_tokens
            totals[2] += usage.cache_read_tokens
            totals[3] += usage.cache_creation_tokens
        cost = row.cost_usd
        if cost is not None:
            cell = slot.cost
            if cell is None:
                cell = slot.cost = self.cost.setdefault(slot.account, [0.0])
            cell[0] += cost
        elif usage is not None:
            unpriced = slot.unpriced
            if unpriced is None:
                unpriced = slot.unpriced = self.unpriced.setdefault(slot.account, [0])
            unpriced[0] += 1
        if row.overhead_ms is not None:
            seconds = row.overhead_ms / 1000.0
            counts = slot.overhead
            if counts is None:
                counts = slot.overhead = self.overhead.setdefault(slot.wire, [0.0] * (len(OVERHEAD_BUCKETS_S) + 2))
            counts[bisect_left(OVERHEAD_BUCKETS_S, seconds)] += 1
            counts[-1] += seconds

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily

        attempts = CounterMetricFamily(
            "leasehold_attempts", "Terminal attempt rows.", labels=["account_id", "wire", "status", "condition"]
        )
        for series, (count,) in self.attempts.items():
            attempts.add_metric(series, count)
        refusals = CounterMetricFamily(
            "leasehold_refusals", "Gateway-authored terminals, by refusal code.", labels=["code"]
        )
        for code, (count,) in self.refusals.items():
            refusals.add_metric([code], count)
        tokens = CounterMetricFamily(
            "leasehold_tokens", "Tokens the upstream reported, by kind.", labels=["account_id", "kind"]
        )
        for account, totals in self.tokens.items():
            for kind, total in zip(TOKEN_KINDS, totals):
                tokens.add_metric([account, kind], total)
        cost = CounterMetricFamily(
            "leasehold_cost_usd", "Priced cost of terminal attempts in USD.", labels=["account_id"]
        )
        for account, (usd,) in self.cost.items():
            cost.add_metric([account], usd)
        unpriced = CounterMetricFamily(
            "leasehold_attempts_unpriced",
            "Attempts with usage but no price (cost null, never counted as 0).",
            labels=["account_id"],
        )
        for account, (count,) in self.unpriced.items():
            unpriced.add_metric([account], count)
        yield from (attempts, refusals, tokens, cost, unpriced, self._overhead())

    def _overhead(self) -> Metric:
        from prometheus_client.core import HistogramMetricFamily

        overhead = HistogramMetricFamily(
            "leasehold_dataplane_overhead_seconds",
            "The data plane's own time before the first upstream byte.",
            labels=["wire"],
        )
        for wire, counts in self.overhead.items():
            cumulative, buckets = 0.0, []
            for bound, in_bucket in zip(bucket_names(), counts):
                cumulative += in_bucket
                buckets.append((bound, cumulative))
            overhead.add_metric([wire], buckets, counts[-1])
        return overhead


class RowCollector:
    def __init__(self, rows: RowCounts) -> None:
        self.rows = rows

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        return self.rows.collect()
