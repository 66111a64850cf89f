"""The terminal chokepoint: one `Attempt` per accepted request, finished exactly once.

`finish()` is idempotent: the first call builds the terminal row, classifies it
(`condition_for_terminal`), logs the one `request_done` line and hands the row to the control
link; later calls do nothing. The proxy calls it on every path and once more in a `finally`, so
an exception or a cancellation still ends the attempt in exactly one row.
"""

from __future__ import annotations

import asyncio
import time

import msgspec

from dataplane.rpc_client import ControlLink
from dataplane.stamps import iso_ms, new_ulid
from dataplane.wires.spec import WireSpec
from dataplane.wires.sse import Observation
from shared.clock import now_ms
from shared.codes import AttemptStatus, Refusal
from shared.evidence import condition_for_terminal
from shared.http1.response import StreamResponse
from shared.logging import get_logger, info_line
from shared.wire import AttemptRow, Lease, RateLimits, Usage

log = get_logger("dataplane")
_COMPLETED = AttemptStatus.COMPLETED  # bound once: an enum member is a slow class attribute


class Attempt:
    __slots__ = (
        "link",
        "lease",
        "spec",
        "wire",
        "path",
        "attempt_id",
        "started_ms",
        "t0",
        "requested_model",
        "stream",
        "done",
        "overhead_ms",
        "bytes_out",
        "seen",
        "task",
        "stopping",
        "response",
        "http_status",
        "sse_plain",
        "row",
        "trace",
        "rate_limits",
        "asked_usage",
        "first_byte_ms",
    )

    def __init__(
        self,
        link: ControlLink,
        lease: Lease,
        spec: WireSpec,
        path: str,
        trace: tuple[str | None, str | None] = (None, None),
    ) -> None:
        self.link = link
        self.lease = lease
        self.spec = spec  # its wire, resolved once (`dataplane/wires/table.WIRES`)
        self.wire = spec.name
        self.path = path
        self.attempt_id = "att_" + new_ulid()
        self.started_ms = now_ms()
        self.t0 = time.perf_counter()
        self.requested_model: str | None = None
        self.stream = False
        self.done = False
        self.overhead_ms: float | None = None
        self.bytes_out = 0
        self.seen: Observation | None = None  # what the relay has learned so far
        self.task: asyncio.Task | None = asyncio.current_task()
        self.stopping = False  # the drain window ran out
        self.response: StreamResponse | None = None  # set once headers went to the worker
        self.http_status: int | None = None  # the status the worker was sent
        self.sse_plain = False  # relaying uncompressed SSE
        self.row: AttemptRow | None = None  # as announced; finished by replacing
        self.trace = trace  # (traceparent, tracestate), SPEC §21
        self.rate_limits: RateLimits | None = None  # the upstream answer's (SPEC §22)
        self.asked_usage = False  # include_usage set by the gateway (§19)
        self.first_byte_ms: float | None = None  # sent upstream → first answer byte (§14)

    def _started_row(self) -> AttemptRow:
        """The row as announced: everything known before the upstream answers. The lease's
        fields come from a template built once per lease and wire: an `AttemptRow` of 28
        named fields costs ~18k instructions to build, a `replace` of the ten per-attempt
        ones ~3.5k (issue 27)."""
        return msgspec.structs.replace(
            _template(self.lease, self.wire),
            attempt_id=self.attempt_id,
            path=self.path,
            requested_model=self.requested_model,
            stream=self.stream,
            started_at=iso_ms(self.started_ms),
            overhead_ms=self.overhead_ms,
            bytes_out=self.bytes_out,
            traceparent=self.trace[0],
            tracestate=self.trace[1],
        )

    def announce(self) -> None:
        row = self.row = self._started_row()
        # A short non-streaming request's start may wait (`START_HOLD_S`); not a dispatch key's,
        # whose hop waits for the dispatch's attempts in flight at control (SPEC §17).
        self.link.started(row, hold=not row.stream and row.transport == "http" and not self.lease.hop_on)

    def mark_overhead(self, upstream_wait_s: float) -> float:
        """Gateway time so far, minus the time spent waiting on the upstream."""
        self.overhead_ms = round((time.perf_counter() - self.t0 - upstream_wait_s) * 1000, 3)
        return self.overhead_ms

    def overhead_header(self, upstream_wait_s: float) -> str:
        """`mark_overhead`, as the overhead header's text (`f"{overhead_ms:.3f}"`). The text is
        formatted once and parsed back: `round(x, 3)` is the same three-decimal formatting of x
        parsed back, so the row's value is the same, for one formatting instead of two (issue
        27: ~2k instructions)."""
        text = f"{(time.perf_counter() - self.t0 - upstream_wait_s) * 1000:.3f}"
        self.overhead_ms = float(text)
        return text

    def finish(
        self,
        status: AttemptStatus,
        http_status: int | None,
        *,
        refusal: Refusal | None = None,
        usage: Usage | None = None,
        served_model: str | None = None,
        retry_after_s: float | None = None,
        wait: bool = False,
    ) -> asyncio.Future[bool] | None:
        """End the attempt (first call only); with `wait`, a future resolved once control
        holds the row (the §7 evidence wait), else nothing to wait on.

        Usage and the served model default to what the relay has seen so far, so a cut or
        aborted stream is billed for what it delivered.
        """
        if self.done:
            return None
        self.done = True
        seen = self.seen
        if seen is not None:
            usage = usage if usage is not None else seen.usage
            served_model = served_model if served_model is not None else seen.model
        # a completed attempt never qualifies (`condition_for_terminal`): skip its enum tests
        condition = None if status is _COMPLETED else condition_for_terminal(status, http_status, refusal)
        duration_ms = round((time.perf_counter() - self.t0) * 1000, 3)
        row = msgspec.structs.replace(
            self.row or self._started_row(),
            served_model=served_model,
            finished_at=iso_ms(now_ms()),
            status=str(status),
            http_status=http_status,
            condition=None if condition is None else str(condition),
            refusal_reason=None if refusal is None else str(refusal),
            usage=usage,
            retry_after_s=retry_after_s,
            duration_ms=duration_ms,
            overhead_ms=self.overhead_ms,
            bytes_out=self.bytes_out,
            rate_limits=self.rate_limits,
            first_byte_ms=self.first_byte_ms,
        )
        if self.lease.hop_on:  # a dispatch key: stop admitting on it before control has the row
            self.link.replica.hop_pending(self.lease, row.condition, row.refusal_reason)
        info_line(
            "dataplane",
            "request_done",
            attempt_id=self.attempt_id,
            account_id=self.lease.account_id,
            key_id=self.lease.key_id,
            status=row.status,
            http_status=http_status,
            code=row.refusal_reason or row.condition,
            bytes=self.bytes_out,
            duration_ms=duration_ms,
        )
        return self.link.finished(row, wait)


TEMPLATES_MAX = 4096  # leases whose row template is kept; cleared when full
_templates: dict[int, tuple[Lease, str, AttemptRow]] = {}  # id(lease) → (lease, wire, template)


def _template(lease: Lease, wire: str) -> AttemptRow:
    """The started row's lease part (the per-attempt fields blank), built once per lease and
    wire. Keyed by the lease object's identity (the entry holds the lease, so its id is not
    reused while kept): a replaced lease is a new object and gets a new template."""
    entry = _templates.get(id(lease))
    if entry is not None and entry[0] is lease and entry[1] == wire:
        return entry[2]
    template = AttemptRow(
        attempt_id="",
        key_id=lease.key_id,
        account_id=lease.account_id,
        mint_decision_id=lease.mint_decision_id,
        dispatch_id=lease.dispatch_id,
        repo_slug=lease.repo_slug,
        principal_id=lease.principal_id,
        principal_kind=lease.principal_kind,
        worker_role=lease.worker_role,
        wire=wire,
        path="",
        requested_model=None,
        stream=False,
        started_at="",
        overhead_ms=None,
        bytes_out=0,
        served_model=None,
        finished_at=None,
        status=None,
        http_status=None,
        condition=None,
        refusal_reason=None,
        usage=None,
        cost_usd=None,
        cost_reason=None,
        traceparent=None,
        tracestate=None,
        hop=lease.hop,
    )
    if len(_templates) >= TEMPLATES_MAX:
        _templates.clear()
    _templates[id(lease)] = (lease, wire, template)
    return template
