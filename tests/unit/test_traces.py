"""controlplane/traces.py over the real OpenTelemetry SDK, with in-process exporters: the span
handed to the SDK, the drop counting (and the SDK's private queue it reads), the lazy import,
and the `OTEL_*` settings."""

from __future__ import annotations

import subprocess
import sys
import threading

import msgspec
import pytest
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from controlplane.core.fallback import Lineage
from controlplane.decisions import Decision
from controlplane.registry import Registry
from controlplane.traces import Traces
from shared.codes import Outcome
from shared.settings import SettingsError, TraceSettings, load_settings, traces_of
from shared.spans import ids_of
from tests.support.harness import REPO
from tests.support.waits import wait_until
from tests.unit.test_spans import ROW, TP

BASE = {"GATEWAY_CONTROL_TOKEN": "c"}


def registry() -> Registry:
    return Registry.from_settings(load_settings(BASE))


def traces(exporter, **bounds: int) -> Traces:
    config = TraceSettings(
        endpoint="http://127.0.0.1:9/v1/traces",
        bsp_schedule_delay_ms=bounds.get("delay", 20),
        bsp_max_queue_size=bounds.get("queue", 2048),
        bsp_max_export_batch_size=bounds.get("batch", 512),
    )
    t = Traces(config, registry(), host_id="host-a")
    t.start(exporter)
    return t


def test_a_row_becomes_one_client_span_with_the_rows_times_and_parent() -> None:
    memory = InMemorySpanExporter()
    t = traces(memory)
    t.on_row(msgspec.structs.replace(ROW, traceparent=TP, tracestate="congo=t61"))
    t.shutdown()
    (span,) = memory.get_finished_spans()
    assert span.kind == SpanKind.CLIENT and span.name == "chat claude-sonnet-4-6"
    assert span.context.span_id == int(ids_of(ROW.attempt_id)[1], 16)
    assert span.parent.span_id == 0x00F067AA0BA902B7 and span.context.trace_id == 0x4BF92F3577B34DA6A3CE929D0E0E4736
    assert span.context.trace_state.to_header() == "congo=t61" and span.parent.is_remote
    assert span.end_time - span.start_time == 1_250_000_000
    assert span.attributes["gen_ai.provider.name"] == "anthropic" and span.attributes["gen_ai.usage.input_tokens"] == 24
    assert span.resource.attributes["service.name"] == "leasehold"
    assert span.resource.attributes["leasehold.host_id"] == "host-a"
    assert t.dropped == 0 and t.exported == 1


def test_an_unsampled_caller_is_honoured_and_nothing_counts_as_lost() -> None:
    memory = InMemorySpanExporter()
    t = traces(memory)
    t.on_row(msgspec.structs.replace(ROW, traceparent=TP[:-2] + "00"))
    t.shutdown()
    assert memory.get_finished_spans() == () and t.dropped == 0


def test_a_sampler_keeps_its_share_and_counts_nothing_dropped() -> None:
    memory = InMemorySpanExporter()
    config = TraceSettings(
        endpoint="http://127.0.0.1:9/v1/traces", bsp_schedule_delay_ms=20, sampler="traceidratio", sampler_ratio=0.0
    )
    t = Traces(config, registry(), host_id=None)
    t.start(memory)
    for i in range(10):
        t.on_row(msgspec.structs.replace(ROW, attempt_id=f"att_{i}"))
    t.shutdown()
    assert memory.get_finished_spans() == () and t.dropped == 0


def test_an_error_row_has_error_status() -> None:
    memory = InMemorySpanExporter()
    t = traces(memory)
    t.on_row(msgspec.structs.replace(ROW, status="upstream-error", http_status=429, condition="rate-limited"))
    t.shutdown()
    (span,) = memory.get_finished_spans()
    assert span.status.status_code == StatusCode.ERROR and span.attributes["error.type"] == "rate-limited"


def test_the_mint_event_rides_on_the_first_attempt_only() -> None:
    memory = InMemorySpanExporter()
    t = traces(memory)
    decision = Decision(
        mint_decision_id="md_1",
        outcome=Outcome.SELECTED,
        key_id="k1",
        account_id="legacy-anthropic",
        lineage=Lineage("d", "acme/app", "claude-sonnet-4-6"),
        at_ms=1_796_119_199_000,
        hop=0,
    )
    t.on_decision(decision)
    t.on_decision(msgspec.structs.replace(decision, mint_decision_id="md_held", key_id=None))  # no lease: nothing
    for attempt in ("att_1", "att_2"):
        t.on_row(msgspec.structs.replace(ROW, attempt_id=attempt, mint_decision_id="md_1"))
    t.shutdown()
    first, second = sorted(memory.get_finished_spans(), key=lambda s: s.attributes["leasehold.attempt_id"])
    assert [e.name for e in first.events] == ["leasehold.mint"] and second.events == ()
    assert first.events[0].timestamp == 1_796_119_199_000 * 1_000_000
    assert first.attributes["leasehold.hop"] == second.attributes["leasehold.hop"] == 0
    assert list(t.notes) == ["md_1"]


class Stuck(InMemorySpanExporter):
    """A collector that does not answer until released, then fails or succeeds."""

    def __init__(self, result: SpanExportResult) -> None:
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()
        self.result = result

    def export(self, spans):
        self.entered.set()
        self.release.wait(10)
        super().export(spans)
        return self.result


def test_a_full_queue_counts_each_span_it_pushes_out() -> None:
    """Guards the SDK's private queue the count reads (tracesdk.CountingProcessor)."""
    stuck = Stuck(SpanExportResult.SUCCESS)
    t = traces(stuck, queue=4, batch=1, delay=5)
    t.on_row(msgspec.structs.replace(ROW, attempt_id="att_first"))
    assert stuck.entered.wait(5)  # the first span is in the stuck export
    for i in range(11):
        t.on_row(msgspec.structs.replace(ROW, attempt_id=f"att_{i}"))
    # four of the eleven sit in the queue: seven were pushed out, each counted at once
    assert t.dropped == 7
    stuck.release.set()
    t.shutdown()
    assert t.exported == 5 and t.dropped == 7 and len(stuck.get_finished_spans()) == 5


def test_a_failed_export_counts_its_batch() -> None:
    failing = Stuck(SpanExportResult.FAILURE)
    failing.release.set()
    t = traces(failing)
    for i in range(3):
        t.on_row(msgspec.structs.replace(ROW, attempt_id=f"att_{i}"))
    wait_until(lambda: t.dropped == 3, 5, "three failures counted")
    t.shutdown()
    assert t.exported == 0


def test_shutdown_is_bounded_and_counts_what_it_abandons() -> None:
    stuck = Stuck(SpanExportResult.SUCCESS)
    t = traces(stuck, batch=1, delay=5)
    for i in range(3):
        t.on_row(msgspec.structs.replace(ROW, attempt_id=f"att_{i}"))
    assert stuck.entered.wait(5)
    t.shutdown()  # waits SHUTDOWN_TIMEOUT_MS at most for the stuck collector
    stuck.release.set()
    assert t.dropped >= 2
    t.on_row(ROW)  # after shutdown: not exported, not an error
    assert t.exported + t.dropped <= 4


def imported(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_the_trace_sdk_is_not_imported_without_an_endpoint() -> None:
    """Control loads the SDK's tracing and the exporter only in `Traces.start`; the data plane
    never. (redis-py imports `opentelemetry.sdk.metrics` whenever it is installed: control's
    embedded mode pays that until it stops importing redis, which issue 27 tracks.)"""
    control = imported("controlplane.main")
    assert "controlplane.traces" in control  # non-vacuity: the module that would import it is loaded
    assert not {
        m
        for m in control
        if m.startswith(("opentelemetry.sdk.trace", "opentelemetry.exporter", "controlplane.tracesdk"))
    }
    assert not {m for m in imported("dataplane.main") if m.startswith("opentelemetry")}


# ---- settings (SPEC §21: the standard OTEL_* variables) -------------------------------------


def test_no_endpoint_no_export() -> None:
    assert load_settings(BASE).traces is None
    assert load_settings({**BASE, "OTEL_SERVICE_NAME": "x"}).traces is None
    on = {**BASE, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
    assert load_settings({**on, "OTEL_SDK_DISABLED": "true"}).traces is None
    assert load_settings({**on, "OTEL_TRACES_EXPORTER": "none"}).traces is None
    assert load_settings({**on, "OTEL_SDK_DISABLED": "false"}).traces is not None


def test_every_variable_is_read() -> None:
    t = load_settings(
        {
            **BASE,
            "OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4318/",
            "OTEL_EXPORTER_OTLP_HEADERS": "x-honeycomb-team=a%3Db, k = v",
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2500",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "9",
            "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
            "OTEL_EXPORTER_OTLP_CERTIFICATE": "/ca.pem",
            "OTEL_SERVICE_NAME": "gw-eu",
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,team=ai",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_BSP_MAX_QUEUE_SIZE": "64",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "8",
            "OTEL_BSP_EXPORT_TIMEOUT": "1000",
        }
    ).traces
    assert t == TraceSettings(
        endpoint="https://c:4318/v1/traces",
        headers=(("x-honeycomb-team", "a=b"), ("k", "v")),
        timeout_s=2.5,
        compression="gzip",
        certificate_file="/ca.pem",
        service_name="gw-eu",
        resource=(("deployment.environment", "prod"), ("team", "ai")),
        bsp_schedule_delay_ms=100,
        bsp_max_queue_size=64,
        bsp_max_export_batch_size=8,
        bsp_export_timeout_ms=1000,
    )


def test_the_traces_endpoint_is_used_as_given() -> None:
    t = load_settings(
        {
            **BASE,
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:4318/custom",
        }
    ).traces
    assert t is not None and t.endpoint == "http://b:4318/custom"


BAD = [
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
    ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd"),
    ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"),
    ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
    ("OTEL_BSP_SCHEDULE_DELAY", "-1"),
    ("OTEL_RESOURCE_ATTRIBUTES", "novalue"),
    ("OTEL_TRACES_EXPORTER", "jaeger"),
    ("OTEL_TRACES_SAMPLER", "parentbased_jaeger_remote"),
    ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
    ("OTEL_TRACES_SAMPLER_ARG", "half"),
]


@pytest.mark.parametrize("name,value", BAD, ids=[f"{n}={v}" for n, v in BAD])
def test_a_bad_otel_variable_is_named(name: str, value: str) -> None:
    env = {**BASE, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", name: value}
    with pytest.raises(SettingsError) as caught:
        load_settings(env)
    assert any(name in problem for problem in caught.value.problems)


def test_a_bad_header_is_named_but_never_echoed() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(
            {**BASE, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_HEADERS": "sk-secret-value"}
        )
    assert "sk-secret-value" not in str(caught.value) and "OTEL_EXPORTER_OTLP_HEADERS" in str(caught.value)
    assert traces_of({}, []) is None


def test_a_bad_signal_specific_variable_is_named_as_written() -> None:
    on = {**BASE, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
    for name, value in (("HEADERS", "sk-secret-value"), ("COMPRESSION", "zstd"), ("TIMEOUT", "10s")):
        with pytest.raises(SettingsError) as caught:
            load_settings({**on, f"OTEL_EXPORTER_OTLP_TRACES_{name}": value})
        assert f"OTEL_EXPORTER_OTLP_TRACES_{name}" in str(caught.value) and "sk-secret" not in str(caught.value)


SERVICE_NAMES = [
    ({}, "leasehold"),
    ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-resource,team=ai"}, "from-resource"),
    ({"OTEL_SERVICE_NAME": "from-env", "OTEL_RESOURCE_ATTRIBUTES": "service.name=from-resource"}, "from-env"),
    ({"OTEL_SERVICE_NAME": "from-env"}, "from-env"),
    ({"OTEL_SERVICE_NAME": " ", "OTEL_RESOURCE_ATTRIBUTES": "service.name=r"}, "r"),
    ({"OTEL_RESOURCE_ATTRIBUTES": "service.name="}, "leasehold"),
]


@pytest.mark.parametrize("env,expected", SERVICE_NAMES, ids=[e for _, e in SERVICE_NAMES])
def test_service_name_precedence(env: dict[str, str], expected: str) -> None:
    """OTEL_SERVICE_NAME, else OTEL_RESOURCE_ATTRIBUTES' service.name, else the default, in the
    settings and on the resource the spans carry."""
    config = load_settings({**BASE, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", **env}).traces
    assert config is not None and config.service_name == expected
    assert Traces(config, registry(), None).resource()["service.name"] == expected


def test_the_logged_endpoint_never_shows_a_password() -> None:
    t = Traces(TraceSettings(endpoint="https://user:s3cret-pass@collector.internal:4318/v1/traces"), registry(), None)
    assert t.shown_endpoint == "https://collector.internal:4318/v1/traces"
