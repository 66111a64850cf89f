"""The OpenTelemetry SDK's pieces `controlplane/traces.py` adapts; imported only when export is on.

- `RowIds`: the id generator hands out the ids `shared/spans.py` derived from the attempt id
  (set just before each `start_span`, on the event loop's one thread).
- `CountingProcessor`: the SDK's `BatchSpanProcessor` (bounded queue, export on its own
  thread), counting the spans its full queue pushes out and those ended after shutdown. The
  SDK drops them silently but for a log line; the count reads the processor's queue, a private
  attribute: `tests/unit/test_traces.py` fails first if the SDK moves it.
- `CountingExporter`: the OTLP exporter, counting each batch it failed to deliver (a collector
  down, slow past the timeout, or answering an error, after the exporter's own retries).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator


class Counter(Protocol):
    def lost(self, spans: int, why: str) -> None: ...
    def delivered(self, spans: int) -> None: ...


class RowIds(IdGenerator):
    def __init__(self) -> None:
        self.trace_id = 1
        self.span_id = 1

    def generate_span_id(self) -> int:
        return self.span_id

    def generate_trace_id(self) -> int:
        return self.trace_id

    def is_trace_id_random(self) -> bool:
        return False  # derived from the attempt id (sha256), not drawn


class CountingProcessor(BatchSpanProcessor):
    def __init__(self, exporter: SpanExporter, counter: Counter, **bounds: float) -> None:
        super().__init__(exporter, **bounds)  # type: ignore[arg-type]
        self.counter = counter
        self.max_queue_size = int(bounds["max_queue_size"])
        self.closed = False

    def on_end(self, span: ReadableSpan) -> None:
        if not (span.context and span.context.trace_flags.sampled):
            return  # the caller's trace is not sampled: not exported, not lost
        if self.closed:
            self.counter.lost(1, "shutdown")
            return
        if len(self._batch_processor._queue) >= self.max_queue_size:
            self.counter.lost(1, "queue-full")  # the SDK pushes the oldest span out for this one
        super().on_end(span)

    def shutdown(self, timeout_millis: int = 30000) -> None:  # type: ignore[override]
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
