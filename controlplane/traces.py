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
certificates; the processor's bounds; the resource; the sampler, id generator and span limits):
`shared/settings.py` read the `OTEL_*` variables.

Mint decisions and dispatch hops are span events on the first attempt that follows them, not
spans of their own: neither has a trace to belong to when it happens (a mint is called by the
orchestrator, before the worker and its `traceparent` exist; a hop is control's own step between
two attempts), and neither is a call to the provider. As events they appear in the trace where
their consequence is — the attempt that ran on the account they chose.
"""

from __future__ import annotations

import logging
import socket
from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, Metric

from controlplane.decisions import Decision
from controlplane.events import DispatchHop
from controlplane.registry import Registry
from shared.logging import get_logger
from shared.settings import Settings, TraceSettings
from shared.spans import Account, DecisionNote, SpanEvent, SpanPlan, span_of
from shared.wire import AttemptRow

if TYPE_CHECKING:  # the SDK is imported by `start`, only when export is on
    from opentelemetry.sdk.trace import Tracer

log = get_logger("control")

NOTES_CAP = 8192            # decisions remembered for the attempts that follow them
SHUTDOWN_TIMEOUT_MS = 2000  # a stopping control waits this long at most for a collector
SPAN_LIMITS = {"max_attributes": 64, "max_events": 8, "max_links": 0, "max_attribute_length": 256}


class Traces:
    """The exporter of SPEC §21; `dropped` counts every span lost after it was built."""

    def __init__(self, config: TraceSettings, registry: Registry, host_id: str | None) -> None:
        self.config = config
        self.registry = registry
        self.host_id = host_id      # fleet mode: `leasehold.host_id` on the resource
        self.dropped = 0
        self.exported = 0
        self.notes: OrderedDict[str, DecisionNote] = OrderedDict()
        self._tracer: Tracer | None = None
        self._provider: Any = None
        self._failing = False

    @classmethod
    def of(cls, settings: Settings, registry: Registry) -> Traces | None:
        if settings.traces is None:
            return None
        return cls(settings.traces, registry, settings.host_id if settings.fleet_redis_url else None)

    # ---- listeners ----------------------------------------------------------------------

    def on_row(self, row: AttemptRow) -> None:
        """A recorded terminal row → its span, queued for export."""
        if self._tracer is None:
            return
        note = self.notes.get(row.mint_decision_id) if row.mint_decision_id else None
        if note is not None and note.events:
            self.notes[row.mint_decision_id] = DecisionNote(hop=note.hop)  # announced once  # type: ignore[index]
        spec = self.registry.get(row.account_id)
        account = None if spec is None else Account(provider_binding=str(spec.provider_binding),
                                                    base_url=spec.base_url)
        self.emit(span_of(row, account, note))

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
        event = SpanEvent(name="leasehold.dispatch_hop", at_ns=at_ns, attributes={
            "leasehold.from_account": hop.from_account, "leasehold.to_account": hop.to_account,
            "leasehold.condition": hop.condition, "leasehold.hop": hop.hop})
        self._note(hop.mint_decision_id, DecisionNote(hop=hop.hop, events=(*note.events, event)))

    def _note(self, decision_id: str, note: DecisionNote) -> None:
        self.notes[decision_id] = note
        self.notes.move_to_end(decision_id)
        while len(self.notes) > NOTES_CAP:
            self.notes.popitem(last=False)

    # ---- the SDK ------------------------------------------------------------------------

    def emit(self, plan: SpanPlan) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode
        from opentelemetry.trace import TraceFlags, TraceState

        context = None
        if plan.parent is not None:
            state = TraceState.from_header([plan.parent.tracestate]) if plan.parent.tracestate else None
            remote = SpanContext(int(plan.parent.trace_id, 16), int(plan.parent.span_id, 16), is_remote=True,
                                 trace_flags=TraceFlags(plan.parent.flags), trace_state=state)
            context = trace.set_span_in_context(NonRecordingSpan(remote))
        ids = self._provider.id_generator
        ids.trace_id, ids.span_id = int(plan.trace_id, 16), int(plan.span_id, 16)
        span = self._tracer.start_span(plan.name, context=context, kind=SpanKind.CLIENT,  # type: ignore[union-attr]
                                       attributes=plan.attributes, start_time=plan.start_ns)
        for event in plan.events:
            span.add_event(event.name, event.attributes, event.at_ns or plan.start_ns)
        if plan.error_type is not None:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=plan.end_ns)

    def start(self, exporter: Any = None) -> None:
        """Import the SDK and build the provider, processor and exporter from the settings (a
        test may hand its own exporter)."""
        from opentelemetry.exporter.otlp.proto.http import Compression
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanLimits, TracerProvider
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

        from controlplane.tracesdk import CountingExporter, CountingProcessor, RowIds

        for name in ("opentelemetry",):  # our own lines say what failed, once, without a flood
            logging.getLogger(name).setLevel(logging.CRITICAL)
        c = self.config
        exporter = exporter or OTLPSpanExporter(
            endpoint=c.endpoint, headers=dict(c.headers), timeout=c.timeout_s,
            compression=Compression.Gzip if c.compression == "gzip" else Compression.NoCompression,
            certificate_file=c.certificate_file, client_key_file=c.client_key_file,
            client_certificate_file=c.client_certificate_file)
        processor = CountingProcessor(
            CountingExporter(exporter, self), self, max_queue_size=c.bsp_max_queue_size,
            schedule_delay_millis=c.bsp_schedule_delay_ms,
            max_export_batch_size=min(c.bsp_max_export_batch_size, c.bsp_max_queue_size),
            export_timeout_millis=c.bsp_export_timeout_ms)
        self._provider = TracerProvider(sampler=ParentBased(ALWAYS_ON), resource=Resource(self.resource()),
                                        shutdown_on_exit=False, id_generator=RowIds(),
                                        span_limits=SpanLimits(**SPAN_LIMITS))
        self._provider.add_span_processor(processor)
        self._tracer = self._provider.get_tracer("leasehold")
        log.info("traces_exporting", endpoint=c.endpoint, queue=c.bsp_max_queue_size,
                 delay_ms=c.bsp_schedule_delay_ms)

    def resource(self) -> dict[str, str]:
        """SPEC §21's resource: `OTEL_RESOURCE_ATTRIBUTES`, then `service.name` (from
        `OTEL_SERVICE_NAME`, else `leasehold`), `host.name`, and the fleet's host id."""
        attrs = dict(self.config.resource)
        attrs["service.name"] = self.config.service_name
        attrs.setdefault("host.name", socket.gethostname())
        attrs.update({"telemetry.sdk.name": "opentelemetry", "telemetry.sdk.language": "python"})
        if self.host_id is not None:
            attrs["leasehold.host_id"] = self.host_id
        return attrs

    def shutdown(self) -> None:
        """Flush what the queue holds, waiting for the collector `SHUTDOWN_TIMEOUT_MS` at most."""
        if self._provider is not None:
            self._tracer = None
            for processor in self._provider._active_span_processor._span_processors:
                processor.shutdown(timeout_millis=SHUTDOWN_TIMEOUT_MS)

    # ---- counting, called from the processor's thread ------------------------------------

    def lost(self, spans: int, why: str) -> None:
        self.dropped += spans
        if not self._failing:
            self._failing = True
            log.warning("trace_export_failing", spans=spans, reason=why, endpoint=self.config.endpoint)

    def delivered(self, spans: int) -> None:
        self.exported += spans
        if self._failing:
            self._failing = False
            log.info("trace_export_recovered", endpoint=self.config.endpoint, dropped_so_far=self.dropped)


def mint_event(decision: Decision) -> SpanEvent:
    """The `leasehold.mint` event: what the decision chose and why, never a token or digest."""
    attrs: dict[str, Any] = {"leasehold.mint_decision_id": decision.mint_decision_id,
                             "leasehold.outcome": str(decision.outcome), "leasehold.hop": decision.hop,
                             "leasehold.policy_revision": decision.policy_revision,
                             "leasehold.fallback_driver": decision.driver}
    optional = {"leasehold.account_id": decision.account_id, "leasehold.fallback_position": decision.fallback_position,
                "leasehold.model_class": decision.model_class, "leasehold.effective_model": decision.effective_model,
                "leasehold.retry_of": decision.retry_of, "leasehold.renewal_of": decision.renewal_of,
                "leasehold.condition": None if decision.hop_condition is None else str(decision.hop_condition)}
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
        yield CounterMetricFamily("leasehold_trace_spans_dropped",
                                  "Attempt spans lost before a collector took them (SPEC §21).",
                                  value=0 if self.traces is None else self.traces.dropped)

