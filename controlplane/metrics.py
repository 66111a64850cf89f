"""Prometheus metrics of the control daemon (SPEC §11), via `prometheus-client`.

Two sources, one registry per app (never the library's global one, so two daemons in one
process — tests — never share counters):
- counters and the overhead histogram are fed from every terminal row the service records
  (`RowCounts.add`, one of `ControlService.row_sinks`), reduced at once to bounded label values
  and numbers (`RowCounts`): they keep counts, token totals, cost and overhead, never a string
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

prometheus-client itself (~1.2 MiB and ~30 modules with its `http.server` and `wsgiref`) is
imported at the first scrape, not at start (issue 27): until then every instrument is plain
numbers (`RowCounts`, `ChoiceCounts`) or computed at scrape time, and the registry is built when
`/metrics` first asks for it (`registry`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from controlplane.circuits import CircuitRegistry
from controlplane.core.budgetwatch import BudgetWatch
from controlplane.core.spend import COST, Dim, SpendFold
from controlplane.core.windows import Window, key_at
from controlplane.events import CloseReason, DispatchHop, EventHub
from controlplane.ports import ControlReads
from controlplane.rowcounts import CONDITIONS, REFUSAL_CODES, RowCollector, RowCounts, bounded
from shared.clock import now_ms
from shared.codes import AdminState, CircuitPhase
from shared.http1.errors import Refused

if TYPE_CHECKING:  # prometheus-client is imported at the first scrape (module docstring)
    from prometheus_client.core import Metric
    from prometheus_client.registry import Collector, CollectorRegistry

    from controlplane.decisions import Decision


class Refreshed(Protocol):
    async def refresh(self) -> None: ...
    def collect(self) -> Iterator[Metric]: ...


class GatewayMetrics:
    """The registry, the row-fed instruments, and the scrape-time gauges over the read ports;
    `spend` and `budgets` add spend's gauges, `collectors` the others' (headroom, traces)."""

    def __init__(
        self,
        reads: ControlReads,
        hub: EventHub,
        circuits: CircuitRegistry,
        admin_state_of: Callable[[str], AdminState] | None = None,
        *,
        spend: _Book | None = None,
        budgets: BudgetWatch | None = None,
        collectors: Iterable[Collector] = (),
    ) -> None:
        self.reads = reads
        self.hub = hub
        self.circuits = circuits
        self.circuit_phases: dict[str, CircuitPhase] = {}  # read by `refresh` before each scrape
        self.admin_state_of = admin_state_of
        self.accounts = frozenset(a.id for a in reads.registry.accounts)
        self.rows = RowCounts(self.accounts)
        self.choices = ChoiceCounts()
        # What control's HTTP server refused, by reason (`shared.http1.server.Server.refused`).
        self.http_refused: Counter[Refused] = Counter()
        # In the order the exposition lists them; registered when the registry is first built.
        self.collectors: list[Collector] = [RowCollector(self.rows), self.choices, _LiveCollector(self)]
        if spend is not None and budgets is not None:
            self.collectors.append(_SpendCollector(spend, budgets, self.accounts))
        self.collectors.extend(collectors)
        self._registry: CollectorRegistry | None = None
        self._watched: list[Refreshed] = []

    @property
    def registry(self) -> CollectorRegistry:
        """The app's own registry (never the library's global one), built at the first scrape."""
        if self._registry is None:
            from prometheus_client import CollectorRegistry

            registry = CollectorRegistry(auto_describe=True)
            for collector in self.collectors:
                registry.register(collector)
            self._registry = registry
        return self._registry

    async def refresh(self) -> None:
        """Read what the scrape-time gauges need from the stores that may be remote."""
        now = now_ms()
        self.circuit_phases = {
            account_id: (await self.circuits.get(account_id, now)).phase for account_id in self.accounts
        }
        for collector in self._watched:
            await collector.refresh()

    def watch(self, collector: Refreshed) -> None:
        """Add a collector whose `refresh` is awaited before each scrape (the fleet's gauges)."""
        self.collectors.append(collector)
        if self._registry is not None:
            self._registry.register(collector)
        self._watched.append(collector)

    def on_hop(self, hop: DispatchHop) -> None:
        self.choices.hop(bounded(hop.condition, CONDITIONS))

    def on_decision(self, decision: Decision) -> None:
        code = bounded(None if decision.refusal_reason is None else str(decision.refusal_reason), REFUSAL_CODES)
        self.choices.decision(str(decision.outcome), code)

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


class ChoiceCounts:
    """The mint's decisions and the gateway's dispatch hops, counted as plain numbers (each key
    a tuple of bounded label values) and rendered as counters at scrape time."""

    def __init__(self) -> None:
        self.decisions: dict[tuple[str, str], int] = {}  # (outcome, code) → count
        self.hops: dict[str, int] = {}  # condition → count

    def decision(self, outcome: str, code: str) -> None:
        self.decisions[outcome, code] = self.decisions.get((outcome, code), 0) + 1

    def hop(self, condition: str) -> None:
        self.hops[condition] = self.hops.get(condition, 0) + 1

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily

        decisions = CounterMetricFamily(
            "leasehold_mint_decisions", "v2 mint decisions, by outcome and refusal code.", labels=["outcome", "code"]
        )
        for series, count in self.decisions.items():
            decisions.add_metric(series, count)
        hops = CounterMetricFamily(
            "leasehold_dispatch_hops", "Dispatch keys moved by the gateway, by condition.", labels=["condition"]
        )
        for condition, count in self.hops.items():
            hops.add_metric([condition], count)
        yield from (decisions, hops)


class _Book(Protocol):
    fold: SpendFold

    def clock(self) -> int: ...


class _SpendCollector:
    def __init__(self, book: _Book, watch: BudgetWatch, accounts: frozenset[str]) -> None:
        self.book, self.watch, self.accounts = book, watch, accounts

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        now = self.book.clock()
        for window in (Window.DAY, Window.MONTH):
            gauge = GaugeMetricFamily(
                f"leasehold_spend_{window}_usd",
                f"Priced spend in the current UTC {window}, by account.",
                labels=["account_id"],
            )
            cells = self.book.fold.cells(key_at(window, now), Dim.ACCOUNT)
            totals = dict.fromkeys(sorted(self.accounts), 0.0)
            for account, cell in cells.items():
                label = bounded(account, self.accounts)
                totals[label] = totals.get(label, 0.0) + cell[COST]
            for account, usd in totals.items():
                gauge.add_metric([account], round(usd, 8))
            yield gauge
        states = GaugeMetricFamily(
            "leasehold_budgets", "Policy budgets by state now (ok, warning: 80 % reached, exhausted).", labels=["state"]
        )
        for state, count in self.watch.states().items():
            states.add_metric([state], count)
        yield states


class _LiveCollector:
    """Gauges computed from the read ports at scrape time."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.m = metrics

    def describe(self) -> list[Metric]:
        return []  # no fixed description: computed on every collect

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        reads = self.m.reads
        in_flight = reads.routes.in_flight_by_account()
        leases = reads.keys.count_by_account()
        g_flight = GaugeMetricFamily("leasehold_in_flight", "Attempts streaming now.", labels=["account_id"])
        g_leased = GaugeMetricFamily("leasehold_leases", "Unexpired leases (virtual keys).", labels=["account_id"])
        g_conf = GaugeMetricFamily(
            "leasehold_account_configured", "1 when the account's credential is set.", labels=["account_id"]
        )
        g_circuit = GaugeMetricFamily(
            "leasehold_circuit_state", "1 for the circuit's current state.", labels=["account_id", "state"]
        )
        g_admin = GaugeMetricFamily(
            "leasehold_account_administrative_state",
            "1 for the account's administrative state.",
            labels=["account_id", "state"],
        )
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
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        hub = self.m.hub
        yield GaugeMetricFamily(
            "leasehold_dataplane_connected",
            "1 while the data plane is connected.",
            value=1 if reads.link.connected else 0,
        )
        yield GaugeMetricFamily(
            "leasehold_ledger_ok", "1 while the ledger accepts appends.", value=1 if reads.ledger.ok else 0
        )
        yield GaugeMetricFamily("leasehold_event_subscribers", "Open event feed readers.", value=len(hub.subscribers))
        yield GaugeMetricFamily(
            "leasehold_event_queue_depth_max",
            "Deepest queue among open event feed readers.",
            value=max((len(s.queue) for s in hub.subscribers), default=0),
        )
        yield GaugeMetricFamily(
            "leasehold_event_queue_high_water",
            "Deepest any reader's event queue has been since start.",
            value=hub.queue_high_water,
        )
        yield GaugeMetricFamily("leasehold_event_queue_limit", "Per-reader event queue bound.", value=hub.queue_max)
        closed = CounterMetricFamily(
            "leasehold_event_subscribers_closed", "Event feed readers closed, by reason.", labels=["reason"]
        )
        for reason in CloseReason:
            closed.add_metric([str(reason)], hub.closed_by_reason[reason])
        yield closed
        yield CounterMetricFamily("leasehold_events_published", "Events published on the feed.", value=hub.published)
        http_refused = CounterMetricFamily(
            "leasehold_control_http_refused",
            "Requests control's HTTP server refused for what the peer sent or failed to send, by reason.",
            labels=["reason"],
        )
        for why in Refused:
            http_refused.add_metric([str(why)], self.m.http_refused[why])
        yield http_refused
        yield CounterMetricFamily(
            "leasehold_dataplane_drains",
            "Drains of the data plane's queued reports a read or mint waited for (coalesced).",
            value=reads.drain.rounds,
        )
        yield CounterMetricFamily(
            "leasehold_dataplane_drains_late",
            "Drains not answered within their deadline: the read answered without waiting longer.",
            value=reads.drain.late,
        )
        bounds = reads.routes.connections  # SPEC §19, as the data plane last reported them
        yield CounterMetricFamily(
            "leasehold_connections_refused",
            "Data plane connections answered 503 connection-limit (GATEWAY_MAX_CONNECTIONS).",
            value=bounds.refused,
        )
        yield CounterMetricFamily(
            "leasehold_header_timeouts",
            "Data plane connections closed for a request head not complete in time (GATEWAY_HEADER_TIMEOUT_SECONDS).",
            value=bounds.head_timeouts,
        )
