"""The row-fed instruments of control's metrics (SPEC §11): each terminal row the service
records (`RowCounts.add`, one of `ControlService.row_sinks`) reduced at once to bounded label
values and numbers, rendered as Prometheus families at scrape time (`RowCollector`).

Labels are account ids, wire, status, condition and code — each a closed vocabulary or the
registry's own account ids; a value outside its vocabulary is counted as `other` rather than
minting a new series (`row_labels`). Never a key id, principal, repo or anything secret.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator

import msgspec
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from shared.codes import AttemptStatus, Condition, Refusal, Wire
from shared.wire import AttemptRow

OTHER = "other"
NONE = "none"
# The data plane's own time before the first upstream byte: sub-millisecond to a few seconds.
OVERHEAD_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
TOKEN_KINDS = ("input", "output", "cache_read", "cache_creation")
_BUCKET_NAMES = (*(floatToGoString(b) for b in OVERHEAD_BUCKETS_S), "+Inf")
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


class RowCounts:
    """What the row-fed instruments count, kept as plain numbers and rendered at scrape time.

    One terminal row costs a few dict updates here instead of eight prometheus `labels()`
    lookups and locked increments (this runs once per attempt on the data plane's core). Each
    key is a tuple of bounded label values (`row_labels`), so the series are as closed as the
    vocabularies; the raw-value → labels memo is cleared when it grows past `MEMO_MAX`.
    """

    MEMO_MAX = 4096

    def __init__(self, accounts: frozenset[str]) -> None:
        self.accounts = accounts
        self.attempts: dict[tuple[str, str, str, str], int] = {}
        self.refusals: dict[str, int] = {}
        self.tokens: dict[str, list[int]] = {}  # account → one total per TOKEN_KINDS
        self.cost: dict[str, float] = {}
        self.unpriced: dict[str, int] = {}
        self.overhead: dict[str, list[float]] = {}  # wire → bucket counts (+Inf last), then sum
        self._memo: dict[tuple, RowLabels] = {}

    def labels_of(self, row: AttemptRow) -> RowLabels:
        key = (row.account_id, row.wire, row.status, row.condition, row.refusal_reason)
        labels = self._memo.get(key)
        if labels is None:
            if len(self._memo) >= self.MEMO_MAX:
                self._memo.clear()
            labels = self._memo[key] = row_labels(*key, self.accounts)
        return labels

    def add(self, row: AttemptRow) -> None:
        labels = self.labels_of(row)
        account = labels.account_id
        series = (account, labels.wire, labels.status, labels.condition)
        self.attempts[series] = self.attempts.get(series, 0) + 1
        if labels.refusal is not None:
            self.refusals[labels.refusal] = self.refusals.get(labels.refusal, 0) + 1
        usage = row.usage
        if usage is not None:
            totals = self.tokens.get(account)
            if totals is None:
                totals = self.tokens[account] = [0, 0, 0, 0]
            totals[0] += usage.input_tokens
            totals[1] += usage.output_tokens
            totals[2] += usage.cache_read_tokens
            totals[3] += usage.cache_creation_tokens
        if row.cost_usd is not None:
            self.cost[account] = self.cost.get(account, 0.0) + row.cost_usd
        elif usage is not None:
            self.unpriced[account] = self.unpriced.get(account, 0) + 1
        if row.overhead_ms is not None:
            seconds = row.overhead_ms / 1000.0
            counts = self.overhead.get(labels.wire)
            if counts is None:
                counts = self.overhead[labels.wire] = [0.0] * (len(OVERHEAD_BUCKETS_S) + 2)
            counts[bisect_left(OVERHEAD_BUCKETS_S, seconds)] += 1
            counts[-1] += seconds

    def collect(self) -> Iterator[Metric]:
        attempts = CounterMetricFamily(
            "leasehold_attempts", "Terminal attempt rows.", labels=["account_id", "wire", "status", "condition"]
        )
        for series, count in self.attempts.items():
            attempts.add_metric(series, count)
        refusals = CounterMetricFamily(
            "leasehold_refusals", "Gateway-authored terminals, by refusal code.", labels=["code"]
        )
        for code, count in self.refusals.items():
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
        for account, usd in self.cost.items():
            cost.add_metric([account], usd)
        unpriced = CounterMetricFamily(
            "leasehold_attempts_unpriced",
            "Attempts with usage but no price (cost null, never counted as 0).",
            labels=["account_id"],
        )
        for account, count in self.unpriced.items():
            unpriced.add_metric([account], count)
        overhead = HistogramMetricFamily(
            "leasehold_dataplane_overhead_seconds",
            "The data plane's own time before the first upstream byte.",
            labels=["wire"],
        )
        for wire, counts in self.overhead.items():
            cumulative, buckets = 0.0, []
            for bound, in_bucket in zip(_BUCKET_NAMES, counts):
                cumulative += in_bucket
                buckets.append((bound, cumulative))
            overhead.add_metric([wire], buckets, counts[-1])
        yield from (attempts, refusals, tokens, cost, unpriced, overhead)


class RowCollector:
    def __init__(self, rows: RowCounts) -> None:
        self.rows = rows

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        return self.rows.collect()
