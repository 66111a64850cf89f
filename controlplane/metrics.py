"""Prometheus metrics of the control daemon (SPEC §11), via `prometheus-client`.

Two sources, one registry per app (never the library's global one, so two daemons in one
process — tests — never share counters):
- counters and the overhead histogram are fed from every terminal row the service records
  (`_RowCounts.add`, one of `ControlService.row_sinks`), reduced at once to bounded label values
  and numbers (`_RowCounts`): they keep counts, token totals, cost and overhead, never a string
  from the row that is not a member of a closed vocabulary, so a metric cannot carry what a read
  payload may not;
- gauges (in flight, leases, circuit state, configured, administrative state, feed readers) are
  computed at scrape time from the daemon's read ports (`controlplane/ports.ControlReads`), so
  they are never stale and never drift; so are spend's (`_SpendCollector`): each account's spend
  in the current UTC day and month (`leasehold_spend_day_usd`, `leasehold_spend_month_usd`: what
  `leasehold_cost_usd`, a counter since the process started, cannot say after a restart or
  across midnight) and how many budgets are `ok`, past 80 % (`warning`) or `exhausted`
  (`leasehold_budgets{state}`) — the budgets themselves are named by level, a repo or team,
  which no label may carry: they are in `GET /control/v2/budgets`.

Labels are account ids, wire, status, condition, state and code — each a closed vocabulary or
the registry's own account ids; a value outside its vocabulary is counted as `other` rather than
minting a new series (`row_labels`). Never a key id, principal, repo or anything secret.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

import msgspec
from prometheus_client import CollectorRegistry, Counter, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.utils import floatToGoString

from controlplane.circuits import CircuitRegistry
from controlplane.core.budgetwatch import BudgetWatch
from controlplane.core.spend import COST, Dim, SpendFold
from controlplane.core.windows import Window, key_at
from controlplane.events import CloseReason, DispatchHop, EventHub
from controlplane.ports import ControlReads
from shared.clock import now_ms
from shared.codes import AdminState, AttemptStatus, CircuitPhase, Condition, Refusal, Wire
from shared.wire import AttemptRow

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from controlplane.decisions import Decision

OTHER = "other"
NONE = "none"
# The data plane's own time before the first upstream byte: sub-millisecond to a few seconds.
OVERHEAD_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
TOKEN_KINDS = ("input", "output", "cache_read", "cache_creation")
_BUCKET_NAMES = (*(floatToGoString(b) for b in OVERHEAD_BUCKETS_S), "+Inf")
_WIRES = frozenset(str(w) for w in Wire)
_STATUSES = frozenset(str(s) for s in AttemptStatus)
_CONDITIONS = frozenset(str(c) for c in Condition)
_REFUSALS = frozenset(str(r) for r in Refusal)


class RowLabels(msgspec.Struct, frozen=True, kw_only=True):
    account_id: str
    wire: str
    status: str
    condition: str
    refusal: str | None


REFUSAL_CODES = frozenset(str(r) for r in Refusal)


def _bounded(value: str | None, allowed: Iterable[str], absent: str = NONE) -> str:
    if value is None:
        return absent
    return value if value in allowed else OTHER


def row_labels(account_id: str, wire: str, status: str | None, condition: str | None,
               refusal_reason: str | None, known_accounts: frozenset[str]) -> RowLabels:
    """The label values one terminal row counts under, each from a closed vocabulary."""
    return RowLabels(
        account_id=_bounded(account_id, known_accounts),
        wire=_bounded(wire, _WIRES),
        status=_bounded(status, _STATUSES),
        condition=_bounded(condition, _CONDITIONS),
        refusal=None if refusal_reason is None else _bounded(refusal_reason, _REFUSALS),
    )


class _RowCounts:
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
        self.tokens: dict[str, list[int]] = {}      # account → one total per TOKEN_KINDS
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
        attempts = CounterMetricFamily("leasehold_attempts", "Terminal attempt rows.",
                                       labels=["account_id", "wire", "status", "condition"])
        for series, count in self.attempts.items():
            attempts.add_metric(series, count)
        refusals = CounterMetricFamily("leasehold_refusals", "Gateway-authored terminals, by refusal code.",
                                       labels=["code"])
        for code, count in self.refusals.items():
            refusals.add_metric([code], count)
        tokens = CounterMetricFamily("leasehold_tokens", "Tokens the upstream reported, by kind.",
                                     labels=["account_id", "kind"])
        for account, totals in self.tokens.items():
            for kind, total in zip(TOKEN_KINDS, totals):
                tokens.add_metric([account, kind], total)
        cost = CounterMetricFamily("leasehold_cost_usd", "Priced cost of terminal attempts in USD.",
                                   labels=["account_id"])
        for account, usd in self.cost.items():
            cost.add_metric([account], usd)
        unpriced = CounterMetricFamily("leasehold_attempts_unpriced",
                                       "Attempts with usage but no price (cost null, never counted as 0).",
                                       labels=["account_id"])
        for account, count in self.unpriced.items():
            unpriced.add_metric([account], count)
        overhead = HistogramMetricFamily("leasehold_dataplane_overhead_seconds",
                                         "The data plane's own time before the first upstream byte.",
                                         labels=["wire"])
        for wire, counts in self.overhead.items():
            cumulative, buckets = 0.0, []
            for bound, in_bucket in zip(_BUCKET_NAMES, counts):
                cumulative += in_bucket
                buckets.append((bound, cumulative))
            overhead.add_metric([wire], buckets, counts[-1])
        yield from (attempts, refusals, tokens, cost, unpriced, overhead)


class Refreshed(Protocol):
    async def refresh(self) -> None: ...
    def collect(self) -> Iterator[Metric]: ...


class GatewayMetrics:
    """The registry, the row-fed instruments, and the scrape-time gauges over the read ports;
    `spend` and `budgets` add spend's gauges, `collectors` the others' (headroom, traces)."""

    def __init__(self, reads: ControlReads, hub: EventHub, circuits: CircuitRegistry,
                 admin_state_of: Callable[[str], AdminState] | None = None, *, spend: _Book | None = None,
                 budgets: BudgetWatch | None = None, collectors: Iterable[Collector] = ()) -> None:
        self.reads = reads
        self.hub = hub
        self.circuits = circuits
        self.circuit_phases: dict[str, CircuitPhase] = {}  # read by `refresh` before each scrape
        self.admin_state_of = admin_state_of
        self.accounts = frozenset(a.id for a in reads.registry.accounts)
        # `*_created` series double every counter for no use a scraper of this daemon has; the
        # switch is process-wide in the library, and this daemon is its only user.
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        self.rows = _RowCounts(self.accounts)
        self.registry.register(_RowCollector(self.rows))
        self.decisions = Counter("leasehold_mint_decisions", "v2 mint decisions, by outcome and refusal code.",
                                 ["outcome", "code"], registry=self.registry)
        self.hops = Counter("leasehold_dispatch_hops", "Dispatch keys moved by the gateway, by condition.",
                            ["condition"], registry=self.registry)
        self.registry.register(_LiveCollector(self))
        if spend is not None and budgets is not None:
            self.registry.register(_SpendCollector(spend, budgets, self.accounts))
        for collector in collectors:
            self.registry.register(collector)
        self._watched: list[Refreshed] = []

    async def refresh(self) -> None:
        """Read what the scrape-time gauges need from the stores that may be remote."""
        now = now_ms()
        self.circuit_phases = {account_id: (await self.circuits.get(account_id, now)).phase
                               for account_id in self.accounts}
        for collector in self._watched:
            await collector.refresh()

    def watch(self, collector: Refreshed) -> None:
        """Add a collector whose `refresh` is awaited before each scrape (the fleet's gauges)."""
        self.registry.register(collector)
        self._watched.append(collector)

    def on_hop(self, hop: DispatchHop) -> None:
        self.hops.labels(_bounded(hop.condition, _CONDITIONS)).inc()

    def on_decision(self, decision: Decision) -> None:
        code = _bounded(None if decision.refusal_reason is None else str(decision.refusal_reason),
                        REFUSAL_CODES)
        self.decisions.labels(str(decision.outcome), code).inc()

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


class _Book(Protocol):
    fold: SpendFold

    def clock(self) -> int: ...


class _SpendCollector:
    def __init__(self, book: _Book, watch: BudgetWatch, accounts: frozenset[str]) -> None:
        self.book, self.watch, self.accounts = book, watch, accounts

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        now = self.book.clock()
        for window in (Window.DAY, Window.MONTH):
            gauge = GaugeMetricFamily(f"leasehold_spend_{window}_usd",
                                      f"Priced spend in the current UTC {window}, by account.", labels=["account_id"])
            cells = self.book.fold.cells(key_at(window, now), Dim.ACCOUNT)
            totals = dict.fromkeys(sorted(self.accounts), 0.0)
            for account, cell in cells.items():
                label = _bounded(account, self.accounts)
                totals[label] = totals.get(label, 0.0) + cell[COST]
            for account, usd in totals.items():
                gauge.add_metric([account], round(usd, 8))
            yield gauge
        states = GaugeMetricFamily("leasehold_budgets", "Policy budgets by state now (ok, warning: 80 % "
                                   "reached, exhausted).", labels=["state"])
        for state, count in self.watch.states().items():
            states.add_metric([state], count)
        yield states


class _RowCollector:
    def __init__(self, rows: _RowCounts) -> None:
        self.rows = rows

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        return self.rows.collect()


class _LiveCollector:
    """Gauges computed from the read ports at scrape time."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.m = metrics

    def describe(self) -> list[Metric]:
        return []  # no fixed description: computed on every collect

    def collect(self) -> Iterator[Metric]:
        reads = self.m.reads
        in_flight = reads.routes.in_flight_by_account()
        leases = reads.keys.count_by_account()
        g_flight = GaugeMetricFamily("leasehold_in_flight", "Attempts streaming now.", labels=["account_id"])
        g_leased = GaugeMetricFamily("leasehold_leases", "Unexpired leases (virtual keys).", labels=["account_id"])
        g_conf = GaugeMetricFamily("leasehold_account_configured",
                                   "1 when the account's credential is set.", labels=["account_id"])
        g_circuit = GaugeMetricFamily("leasehold_circuit_state", "1 for the circuit's current state.",
                                      labels=["account_id", "state"])
        g_admin = GaugeMetricFamily("leasehold_account_administrative_state",
                                    "1 for the account's administrative state.", labels=["account_id", "state"])
        for account in reads.registry.accounts:
            g_flight.add_metric([account.id], in_flight.get(account.id, 0))
            g_leased.add_metric([account.id], leases.get(account.id, 0))
            g_conf.add_metric([account.id], 1 if reads.configured(account) else 0)
            phase = self.m.circuit_phases.get(account.id, CircuitPhase.CLOSED)
            for state in CircuitPhase:
                g_circuit.add_metric([account.id, str(state)], 1 if state == phase else 0)
            current = self._admin_state(account.id)
            for admin_state in AdminState if current is not None else ():
                g_admin.add_metric([account.id, str(admin_state)], 1 if admin_state == current else 0)
        yield from (g_flight, g_leased, g_conf, g_circuit, g_admin)
        yield from self._daemon(reads)

    def _admin_state(self, account_id: str) -> AdminState | None:
        """None when no overlay is wired or it cannot answer: no series beats a guessed one."""
        if self.m.admin_state_of is None:
            return None
        try:
            return AdminState(self.m.admin_state_of(account_id))
        except Exception:
            return None

    def _daemon(self, reads: ControlReads) -> Iterator[Metric]:
        hub = self.m.hub
        yield GaugeMetricFamily("leasehold_dataplane_connected", "1 while the data plane is connected.",
                                value=1 if reads.link.connected else 0)
        yield GaugeMetricFamily("leasehold_ledger_ok", "1 while the ledger accepts appends.",
                                value=1 if reads.ledger.ok else 0)
        yield GaugeMetricFamily("leasehold_event_subscribers", "Open event feed readers.",
                                value=len(hub.subscribers))
        yield GaugeMetricFamily("leasehold_event_queue_depth_max",
                                "Deepest queue among open event feed readers.",
                                value=max((len(s.queue) for s in hub.subscribers), default=0))
        yield GaugeMetricFamily("leasehold_event_queue_high_water",
                                "Deepest any reader's event queue has been since start.",
                                value=hub.queue_high_water)
        yield GaugeMetricFamily("leasehold_event_queue_limit", "Per-reader event queue bound.",
                                value=hub.queue_max)
        closed = CounterMetricFamily("leasehold_event_subscribers_closed",
                                     "Event feed readers closed, by reason.", labels=["reason"])
        for reason in CloseReason:
            closed.add_metric([str(reason)], hub.closed_by_reason[reason])
        yield closed
        yield CounterMetricFamily("leasehold_events_published", "Events published on the feed.",
                                  value=hub.published)
        bounds = reads.routes.connections   # SPEC §19, as the data plane last reported them
        yield CounterMetricFamily("leasehold_connections_refused", "Data plane connections answered "
                                  "503 connection-limit (GATEWAY_MAX_CONNECTIONS).", value=bounds.refused)
        yield CounterMetricFamily("leasehold_header_timeouts", "Data plane connections closed for a "
                                  "request head not complete in time (GATEWAY_HEADER_TIMEOUT_SECONDS).",
                                  value=bounds.head_timeouts)
