"""The OpenTelemetry SDK's pieces `controlplane/traces.py` adapts; imported only when export is on.

- `readable_span`: a `SpanPlan` as the SDK's finished span. It is built whole rather than
  through a `Tracer`: its times, ids and attributes are all known, and the tracer's
  per-attribute validation was most of the per-row cost (measured on a loaded machine: 137 →
  55 µs per row from the row to the queue). Sampling is decided before, by
  `shared/spans.sampled` (`OTEL_TRACES_SAMPLER`).
- `CountingProcessor`: the SDK's `BatchSpanProcessor` (bounded queue, export on its own
  thread), counting the spans its full queue pushes out and those ended after shutdown. The
  SDK drops them silently but for a log line; the count reads the processor's queue, a private
  attribute: `tests/unit/test_traces.py` fails first if the SDK moves it.
- `CountingExporter`: the OTLP exporter, counting each batch it failed to deliver (a collector
  down, slow past the timeout, or answering an error, after the exporter's own retries).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from shared.spans import SpanPlan

ATTRIBUTE_MAX_CHARS = 256  # a string attribute (a model name the worker chose) is cut here
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET, _ERROR = Status(StatusCode.UNSET), Status(StatusCode.ERROR)


class Counter(Protocol):
    def lost(self, spans: int, why: str) -> None: ...
    def delivered(self, spans: int) -> None: ...


class FixedResource(Resource):
    """The one resource of every span, its hash computed once: the exporter groups each batch's
    spans by resource, and the SDK's `Resource.__hash__` re-encodes the attributes as JSON on
    every call (a tenth of the encoding's cost)."""

    def __init__(self, attributes: dict[str, Any]) -> None:
        super().__init__(attributes)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or super().__eq__(other)


def _bounded(attributes: dict[str, Any]) -> dict[str, Any]:
    return {k: v[:ATTRIBUTE_MAX_CHARS] if isinstance(v, str) else v for k, v in attributes.items()}


def readable_span(plan: SpanPlan, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    parent = state = None
    if plan.parent is not None:
        state = TraceState.from_header([plan.parent.tracestate]) if plan.parent.tracestate else None
        parent = SpanContext(
            int(plan.parent.trace_id, 16),
            int(plan.parent.span_id, 16),
            is_remote=True,
            trace_flags=TraceFlags(plan.parent.flags),
            trace_state=state,
        )
    context = SpanContext(
        int(plan.trace_id, 16), int(plan.span_id, 16), is_remote=False, trace_flags=_SAMPLED, trace_state=state
    )
    events = [Event(e.name, _bounded(e.attributes), e.at_ns or plan.start_ns) for e in plan.events]
    return ReadableSpan(
        plan.name,
        context,
        parent,
        resource,
        _bounded(plan.attributes),
        events,
        (),
        SpanKind.CLIENT,
        None,
        _ERROR if plan.error_type is not None else _UNSET,
        plan.start_ns,
        plan.end_ns,
        scope,
    )


class CountingProcessor(BatchSpanProcessor):
    def __init__(self, exporter: SpanExporter, counter: Counter, **bounds: float) -> None:
        super().__init__(exporter, **bounds)  # type: ignore[arg-type]
        self.counter = counter
        self.max_queue_size = int(bounds["max_queue_size"])
        self.closed = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.closed:
            self.counter.lost(1, "shutdown")
            return
        if len(self._batch_processor._queue) >= self.max_queue_size:
            self.counter.lost(1, "queue-full")  # the SDK pushes the oldest span out for this one
        super().on_end(span)

    def shutdown(self, timeout_millis: int = 30000) -> None:
        self.closed = True
        self._batch_processor.shutdown(timeout_millis=timeout_millis)
        left = len(self._batch_processor._queue)  # the collector did not take them in time
        if left:
            self.counter.lost(left, "shutdown")


class CountingExporter(SpanExporter):
    def __init__(self, inner: SpanExporter, counter: Counter) -> None:
        self.inner = inner
        self.counter = counter

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception:  # the processor's thread must survive an exporter's bug
            result = SpanExportResult.FAILURE
        if result == SpanExportResult.SUCCESS:
            self.counter.delivered(len(spans))
        else:
            self.counter.lost(len(spans), "export-failed")
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)
