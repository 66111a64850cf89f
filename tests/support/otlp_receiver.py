"""A real OTLP/HTTP traces receiver for tests: aiohttp on 127.0.0.1, decoding with `opentelemetry-proto`.

It answers `POST /v1/traces` as a collector does (200 and an empty
`ExportTraceServiceResponse`), keeps every request body as received (for the secret sweep)
and every span decoded into a plain `ReceivedSpan`. `mode` plays the collector failures of
SPEC §21: `"ok"`, `"error"` (500 to everything), `"slow"` (answers after `delay_s`); a collector
that is down is one never started or `stop`ped. It runs on its own thread and event loop, so
the synchronous system tests read it directly.
"""

from __future__ import annotations

import asyncio
import gzip
import threading
from typing import Any

import msgspec
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.support.waits import wait_until

KIND = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}


class ReceivedEvent(msgspec.Struct, frozen=True):
    name: str
    at_ns: int
    attributes: dict[str, Any]


class ReceivedSpan(msgspec.Struct, frozen=True):
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    trace_state: str
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status: int  # 0 unset, 1 ok, 2 error
    events: list[ReceivedEvent]
    resource: dict[str, Any]


def value_of(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return tuple(value_of(v) for v in value.array_value.values)
    return None if which is None else getattr(value, which)


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: value_of(a.value) for a in resource_spans.resource.attributes}
        for scope in resource_spans.scope_spans:
            for s in scope.spans:
                spans.append(
                    ReceivedSpan(
                        name=s.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(),
                        trace_state=s.trace_state,
                        kind=KIND[s.kind],
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        attributes={a.key: value_of(a.value) for a in s.attributes},
                        status=s.status.code,
                        events=[
                            ReceivedEvent(e.name, e.time_unix_nano, {a.key: value_of(a.value) for a in e.attributes})
                            for e in s.events
                        ],
                        resource=resource,
                    )
                )
    return spans


class OtlpReceiver:
    def __init__(self) -> None:
        self.mode = "ok"
        self.delay_s = 0.0
        self.bodies: list[bytes] = []  # as received (decompressed), for the secret sweep
        self.headers: list[dict[str, str]] = []
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        """The base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT` takes it."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OtlpReceiver:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        with self._lock:
            self.requests += 1
        if self.mode == "slow":
            await asyncio.sleep(self.delay_s)
        if self.mode == "error":
            return web.Response(status=500, text="collector failing")
        spans = decode(body)
        with self._lock:
            self.bodies.append(body)
            self.headers.append(dict(request.headers))
            self.spans.extend(spans)
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    def stop(self) -> None:
        """Stop listening (the collector is down); `start` is not called again."""
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._runner = None

    def close(self) -> None:
        if self._thread.is_alive():
            self.stop()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()

    def span_of(self, attempt_id: str) -> ReceivedSpan | None:
        with self._lock:
            return next((s for s in self.spans if s.attributes.get("leasehold.attempt_id") == attempt_id), None)

    def wait_span(self, attempt_id: str, timeout_s: float = 15) -> ReceivedSpan:
        return wait_until(lambda: self.span_of(attempt_id), timeout_s, f"the span of {attempt_id}")


def main() -> None:
    """`python -m tests.support.otlp_receiver --port-file F`: a receiver as its own process (the
    benchmark's collector, so its decoding is not charged to the process measured)."""
    import argparse
    import signal
    from pathlib import Path

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--port-file", required=True)
    args = parser.parse_args()
    receiver = OtlpReceiver().start()
    Path(args.port_file).write_text(str(receiver.port))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    print(f"received {len(receiver.spans)} spans in {receiver.requests} requests", flush=True)
    receiver.close()


if __name__ == "__main__":
    main()
