"""SPEC §21's export: one OpenTelemetry span per recorded attempt row, over OTLP/HTTP.

`Traces` is a row listener of `ControlService` (and a listener of the mint desk's decisions and
the hopper's hops). It is built only when `Settings.traces` is set, and only then is the SDK
imported (`start`), so a deployment without a collector never loads it.

Never a lost row, never a slow one: `on_row` turns the row into a `SpanPlan` (shared/spans.py),
starts and ends one SDK span with the row's own times, and hands it to the batch processor,
whose bounded queue takes it without waiting; the export runs on the processor's thread. A
collector that is down, slow or answering errors only costs spans, never rows, and each lost
span is counted (`dropped`, shown as `leasehold_trace_spans_dropped_total`): one the full
queue pushed out, one whose batch the exporter failed to deliver, one ended after shutdown.

The SDK is handed every setting explicitly (exporter endpoint, headers, timeout, compression,
certificates; the processor's bounds; the resource): `shared/settings.py` read the `OTEL_*`
variables. Spans are the SDK's own `ReadableSpan`, built whole from the plan (see `emit`).

Mint decisions and dispatch hops are span events on the first attempt that follows them, not
spans of their own: neither has a trace to belong to when it happens (a mint is called by the
orchestrator, before the worker and its `traceparent` exist; a hop is control's own step between
two attempts), and neither is a call to the provider. As events they appear in the trace where
their consequence is — the attempt that ran on the account they chose.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from controlplane.decisions import Decision
from controlplane.events import DispatchHop
from controlplane.registry import Registry
from shared.logging import get_logger
from shared.settings import Settings, TraceSettings
from shared.spans import Account, DecisionNote, SpanEvent, SpanPlan, account_of, sampled, span_of
from shared.wire import AttemptRow

if TYPE_CHECKING:  # prometheus-client is imported at the first scrape (controlplane/metrics.py)
    from prometheus_client.core import Metric

log = get_logger("control")

NOTES_CAP = 8192  # decisions remembered for the attempts that follow them
SHUTDOWN_TIMEOUT_MS = 2000  # a stopping control waits this long at most for a collector


def leasehold_version() -> str:
    """The installed package's version, for the spans' instrumentation scope. Read when export
    starts: `importlib.metadata` (~1 MiB and a scan of sys.path) is not imported at every start."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("leasehold")
    except PackageNotFoundError:  # run from a checkout that was not installed
        return "0"


class Traces:
    """The exporter of SPEC §21; `dropped` counts every span lost after it was built."""

    def __init__(self, config: TraceSettings, registry: Registry, host_id: str | None) -> None:
        self.config = config
        self.registry = registry
        self.host_id = host_id  # fleet mode: `leasehold.host_id` on the resource
        self.dropped = 0
        self.exported = 0
        self.notes: OrderedDict[str, DecisionNote] = OrderedDict()
        self.started = False
        self._accounts: dict[str, Account] = {}
        self._processor: Any = None  # the SDK's objects, once `start` imported it
        self._resource: Any = None
        self._scope: Any = None
        self._readable: Any = None
        self._failing = False
        self._count_lock = threading.Lock()  # counted from the loop and from the export thread

    @classmethod
    def of(cls, settings: Settings, registry: Registry) -> Traces | None:
        if settings.traces is None:
            return None
        return cls(settings.traces, registry, settings.host_id if settings.fleet_redis_url else None)

    # ---- listeners ----------------------------------------------------------------------

    def on_row(self, row: AttemptRow) -> None:
        """A recorded terminal row → its span, queued for export."""
        if not self.started:
            return
        decision_id = row.mint_decision_id
        note = self.notes.get(decision_id) if decision_id else None
        if note is not None and note.events and decision_id:
            self.notes[decision_id] = DecisionNote(hop=note.hop)  # announced once
        self.emit(span_of(row, self._account(row.account_id), note))

    def _account(self, account_id: str) -> Account | None:
        """The registry's account as the span names it, computed once per account."""
        if account_id not in self._accounts:
            spec = self.registry.get(account_id)
            if spec is None:
                return None
            self._accounts[account_id] = account_of(str(spec.provider_binding), spec.base_url)
        return self._accounts[account_id]

    def on_decision(self, decision: Decision) -> None:
        """A lease-bearing mint decision: its hop, and a `leasehold.mint` event for the first
        attempt under it."""
        if decision.key_id is None:
            return
        self._note(decision.mint_decision_id, DecisionNote(hop=decision.hop, events=(mint_event(decision),)))

    def on_hop(self, hop: DispatchHop) -> None:
        """A dispatch key moved (SPEC §17): a `leasehold.dispatch_hop` event beside the mint's."""
        note = self.notes.get(hop.mint_decision_id) or DecisionNote(hop=hop.hop)
        at_ns = note.events[0].at_ns if note.events else 0
        event = SpanEvent(
            name="leasehold.dispatch_hop",
            at_ns=at_ns,
            attributes={
                "leasehold.from_account": hop.from_account,
                "leasehold.to_account": hop.to_account,
                "leasehold.condition": hop.condition,
                "leasehold.hop": hop.hop,
            },
        )
        self._note(hop.mint_decision_id, DecisionNote(hop=hop.hop, events=(*note.events, event)))

    def _note(self, decision_id: str, note: DecisionNote) -> None:
        self.notes[decision_id] = note
        self.notes.move_to_end(decision_id)
        while len(self.notes) > NOTES_CAP:
            self.notes.popitem(last=False)

    # ---- the SDK ------------------------------------------------------------------------

    def emit(self, plan: SpanPlan) -> None:
        """The plan as the SDK's finished span (`tracesdk.readable_span`), handed to the batch
        processor, if the sampler keeps it (by default: unless the caller did not sample its
        trace). A span sampled out is neither exported nor counted as dropped."""
        if sampled(plan, self.config.sampler, self.config.sampler_ratio):
            self._processor.on_end(self._readable(plan, self._resource, self._scope))

    def start(self, exporter: Any = None) -> None:
        """Import the SDK and build the processor and exporter from the settings (a test may
        hand its own exporter)."""
        from opentelemetry.exporter.otlp.proto.http import Compression
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        from controlplane.tracesdk import CountingExporter, CountingProcessor, FixedResource, readable_span

        logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)  # our own lines say what failed, once
        c = self.config
        exporter = exporter or OTLPSpanExporter(
            endpoint=c.endpoint,
            headers=dict(c.headers),
            timeout=c.timeout_s,
            compression=Compression.Gzip if c.compression == "gzip" else Compression.NoCompression,
            certificate_file=c.certificate_file,
            client_key_file=c.client_key_file,
            client_certificate_file=c.client_certificate_file,
        )
        self._processor = CountingProcessor(
            CountingExporter(exporter, self),
            self,
            max_queue_size=c.bsp_max_queue_size,
            schedule_delay_millis=c.bsp_schedule_delay_ms,
            max_export_batch_size=min(c.bsp_max_export_batch_size, c.bsp_max_queue_size),
            export_timeout_millis=c.bsp_export_timeout_ms,
        )
        self._resource = FixedResource(self.resource())
        self._scope = InstrumentationScope("leasehold", leasehold_version())
        self._readable = readable_span
        self.started = True
        log.info(
            "traces_exporting",
            endpoint=self.shown_endpoint,
            queue=c.bsp_max_queue_size,
            delay_ms=c.bsp_schedule_delay_ms,
        )

    @property
    def shown_endpoint(self) -> str:
        """The endpoint as logged: without a user or password it may carry."""
        parts = urlsplit(self.config.endpoint)
        host = parts.hostname or ""
        return f"{parts.scheme}://{host}{'' if parts.port is None else f':{parts.port}'}{parts.path}"

    def resource(self) -> dict[str, str]:
        """SPEC §21's resource: `OTEL_RESOURCE_ATTRIBUTES`, then `service.name` (from
        `OTEL_SERVICE_NAME`, else the resource attributes' own, else `leasehold`: settled by
        `shared/otelsettings.py`), `host.name`, and the fleet's host id."""
        attrs = dict(self.config.resource)
        attrs["service.name"] = self.config.service_name
        attrs.setdefault("host.name", socket.gethostname())
        attrs.update({"telemetry.sdk.name": "opentelemetry", "telemetry.sdk.language": "python"})
        if self.host_id is not None:
            attrs["leasehold.host_id"] = self.host_id
        return attrs

    def shutdown(self) -> None:
        """Flush what the queue holds, waiting for the collector `SHUTDOWN_TIMEOUT_MS` at most;
        a row recorded after this is not exported (and counted lost)."""
        if self._processor is not None:
            self._processor.shutdown(timeout_millis=SHUTDOWN_TIMEOUT_MS)

    def flush(self) -> None:
        """Export everything queued now (the benchmark's end of a round)."""
        if self._processor is not None:
            self._processor.force_flush()

    # ---- counting, called from the processor's thread ------------------------------------

    def lost(self, spans: int, why: str) -> None:
        with self._count_lock:
            self.dropped += spans
            first, self._failing = not self._failing, True
        if first:
            log.warning("trace_export_failing", spans=spans, reason=why, endpoint=self.shown_endpoint)

    def delivered(self, spans: int) -> None:
        with self._count_lock:
            self.exported += spans
            recovered, self._failing = self._failing, False
        if recovered:
            log.info("trace_export_recovered", endpoint=self.shown_endpoint, dropped_so_far=self.dropped)


def mint_event(decision: Decision) -> SpanEvent:
    """The `leasehold.mint` event: what the decision chose and why, never a token or digest."""
    attrs: dict[str, Any] = {
        "leasehold.mint_decision_id": decision.mint_decision_id,
        "leasehold.outcome": str(decision.outcome),
        "leasehold.hop": decision.hop,
        "leasehold.policy_revision": decision.policy_revision,
        "leasehold.fallback_driver": decision.driver,
    }
    optional = {
        "leasehold.account_id": decision.account_id,
        "leasehold.fallback_position": decision.fallback_position,
        "leasehold.model_class": decision.model_class,
        "leasehold.effective_model": decision.effective_model,
        "leasehold.retry_of": decision.retry_of,
        "leasehold.renewal_of": decision.renewal_of,
        "leasehold.condition": None if decision.hop_condition is None else str(decision.hop_condition),
    }
    attrs.update({k: v for k, v in optional.items() if v is not None})
    if decision.skipped:
        attrs["leasehold.skipped"] = tuple(f"{s.account_id}:{s.code}" for s in decision.skipped)[:16]
    return SpanEvent(name="leasehold.mint", at_ns=decision.at_ms * 1_000_000, attributes=attrs)


class TraceCollector:
    """`leasehold_trace_spans_dropped_total` (always present: 0 with export off)."""

    def __init__(self, traces: Traces | None) -> None:
        self.traces = traces

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily

        yield CounterMetricFamily(
            "leasehold_trace_spans_dropped",
            "Attempt spans lost before a collector took them (SPEC §21).",
            value=0 if self.traces is None else self.traces.dropped,
        )
