"""The measurements of one run, each taken for every column back to back.

Rule: a phase runs the same job against each target in turn (direct, minimal proxy, Leasehold,
peers), so the columns see the same machine state within seconds of each other; every job runs
in a fresh generator process on the generator's core(s). A phase returns plain dicts keyed by
target name; derived figures (ratios, aims) are computed later from those alone.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from bench.control_ops import leasehold_settled
from bench.procs import HeldStreams, Layout, Servers, Target, hwm_kib, rss_kib, run_loadgen
from bench.stats import merge_rate, merge_saturation

MODEL = "claude-sonnet-4-6"
ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01", "content-type": "application/json"}
# The stub's Anthropic stream has 6 fixed events around the text deltas.
FIXED_EVENTS = 6


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """Sizes and durations of a run (`default`, `quick` and `smoke` presets in bench/run.py)."""

    body_bytes: int = 2048
    rounds: int = 3  # saturation and fixed-rate phases alternate the targets this many times
    warm_requests: int = 50
    saturate_connections: int = 64
    saturate_warmup_s: float = 0.5
    saturate_s: float = 5.0
    rate: int = 200
    rate_warmup_s: float = 0.5
    rate_s: float = 10.0
    stream_rate: int = 50
    stream_rate_s: float = 4.0
    streams: int = 200
    stream_chunks: int = 50
    stream_gap_s: float = 0.02
    held_streams: int = 1000
    hold_stall_s: float = 120.0
    mint_warmup: int = 20
    mint_iterations: int = 300
    start_trials: int = 3
    rpc_s: float = 1.0
    rpc_sequential: int = 500
    hostile_s: float = 4.0  # the hostile phase's /healthz window under bombs (0: no hostile phase)
    # the WebSocket phase (bench/websocket.py): turns and events for latency, a burst through one
    # socket, and how many sockets at once (throughput and RSS per open socket)
    ws_turns: int = 5
    ws_events: int = 200
    ws_burst: int = 5000
    ws_sockets: int = 200


class Context(msgspec.Struct, kw_only=True):
    plan: Plan
    layout: Layout
    servers: Servers
    targets: list[Target]


def request_body(plan: Plan, stream: bool) -> str:
    """An Anthropic Messages request of about `plan.body_bytes` bytes."""
    base = {"model": MODEL, "max_tokens": 64, "stream": stream, "messages": [{"role": "user", "content": ""}]}
    pad = max(0, plan.body_bytes - len(json.dumps(base)))
    base["messages"][0]["content"] = "x" * pad
    return json.dumps(base)


def _job(
    ctx: Context, target: Target, kind: str, *, stream: bool, step: dict[str, Any] | None, **params: Any
) -> dict[str, Any]:
    headers = dict(target.headers)
    if step is not None and target.stream_step_header:
        headers["x-stub-step"] = json.dumps(step)
    return {
        "kind": kind,
        "host": target.host,
        "port": target.port,
        "path": target.path,
        "headers": headers,
        "body": request_body(ctx.plan, stream),
        "watch_pids": target.pids,
        "cpus": list(ctx.layout.generator_cpus or ()),
        **params,
    }


def _scripted(ctx: Context, target: Target, step: dict[str, Any] | None, count: int) -> None:
    """For a target that cannot carry `x-stub-step`, queue `count` steps in the stub instead."""
    if step is not None and not target.stream_step_header:
        ctx.servers.stub.reset()
        ctx.servers.stub.script(*([step] * count))


def _unscripted(ctx: Context, target: Target) -> None:
    if not target.stream_step_header:
        ctx.servers.stub.reset()


def stream_step(plan: Plan) -> dict[str, Any]:
    return {"deltas": max(0, plan.stream_chunks - FIXED_EVENTS), "stall_between_events_s": plan.stream_gap_s}


def held_step(plan: Plan) -> dict[str, Any]:
    return {"deltas": 3, "stall_after_events": 3, "stall_s": plan.hold_stall_s}


# ---- phases -----------------------------------------------------------------------------------


def warm(ctx: Context) -> None:
    """A few requests per target so lazy imports, pools and caches exist before measuring."""
    for target in ctx.targets:
        run_loadgen(_job(ctx, target, "streams", stream=False, step=None, count=ctx.plan.warm_requests))
        step = {"deltas": 3}
        _scripted(ctx, target, step, 5)
        run_loadgen(_job(ctx, target, "streams", stream=True, step=step, count=5))
        _unscripted(ctx, target)


def held_streams(ctx: Context) -> dict[str, Any]:
    """RSS of every daemon with `held_streams` open streams; KiB per stream over the idle RSS."""
    out: dict[str, Any] = {}
    step = held_step(ctx.plan)
    count = ctx.plan.held_streams
    for target in ctx.targets:
        _scripted(ctx, target, step, count)
        idle = {name: rss_kib(pid) for name, pid in target.pids.items()}
        held = HeldStreams(_job(ctx, target, "hold", stream=True, step=step, count=count, timeout_s=60))
        during = {name: rss_kib(pid) for name, pid in target.pids.items()}
        peak = {name: hwm_kib(pid) for name, pid in target.pids.items()}
        released = held.release()
        _unscripted(ctx, target)
        daemons = {}
        for name in target.pids:
            before, now = idle[name], during[name]
            daemons[name] = {
                "rss_idle_kib": before,
                "rss_held_kib": now,
                "peak_rss_kib": peak[name],
                "kib_per_stream": None
                if before is None or now is None or not held.state["held"]
                else round((now - before) / held.state["held"], 2),
            }
        out[target.name] = {"streams_open": held.state["held"], "errors": released["errors"], "daemons": daemons}
        gateway = ctx.servers.gateway_named(target.name)
        if gateway is not None:
            out[target.name]["settled"] = leasehold_settled(gateway)
    return out


def _in_rounds(ctx: Context, one) -> dict[str, list[dict[str, Any]]]:
    """Run `one(target, round_share)` for every target, `plan.rounds` times, interleaved."""
    rounds = max(1, ctx.plan.rounds)
    out: dict[str, list[dict[str, Any]]] = {t.name: [] for t in ctx.targets}
    for _ in range(rounds):
        for target in ctx.targets:
            out[target.name].append(one(target, 1.0 / rounds))
    return out


def saturation(ctx: Context) -> dict[str, Any]:
    plan = ctx.plan
    runs = _in_rounds(
        ctx,
        lambda t, share: run_loadgen(
            _job(
                ctx,
                t,
                "saturate",
                stream=False,
                step=None,
                connections=plan.saturate_connections,
                warmup_s=plan.saturate_warmup_s,
                duration_s=plan.saturate_s * share,
            )
        ),
    )
    return {name: merge_saturation(parts) for name, parts in runs.items()}


def fixed_rate(ctx: Context) -> dict[str, Any]:
    plan = ctx.plan
    runs = _in_rounds(
        ctx,
        lambda t, share: run_loadgen(
            _job(
                ctx,
                t,
                "rate",
                stream=False,
                step=None,
                rate=plan.rate,
                warmup_s=plan.rate_warmup_s,
                duration_s=plan.rate_s * share,
            )
        ),
    )
    return {name: merge_rate(parts) for name, parts in runs.items()}


def stream_rate(ctx: Context) -> dict[str, Any]:
    """Streams opened at a moderate fixed rate: the TTFB a single worker sees, unqueued."""
    plan = ctx.plan
    step = {"deltas": max(0, plan.stream_chunks - FIXED_EVENTS)}

    def one(t: Target, share: float) -> dict[str, Any]:
        count = int((plan.rate_warmup_s + plan.stream_rate_s * share) * plan.stream_rate) + 1
        _scripted(ctx, t, step, count)
        try:
            return run_loadgen(
                _job(
                    ctx,
                    t,
                    "rate",
                    stream=True,
                    step=step,
                    rate=plan.stream_rate,
                    warmup_s=plan.rate_warmup_s,
                    duration_s=plan.stream_rate_s * share,
                )
            )
        finally:
            _unscripted(ctx, t)

    return {name: merge_rate(parts) for name, parts in _in_rounds(ctx, one).items()}


def concurrent_streams(ctx: Context) -> dict[str, Any]:
    plan = ctx.plan
    step = stream_step(plan)
    out = {}
    for t in ctx.targets:
        _scripted(ctx, t, step, plan.streams)
        out[t.name] = run_loadgen(_job(ctx, t, "streams", stream=True, step=step, count=plan.streams))
        _unscripted(ctx, t)
        gateway = ctx.servers.gateway_named(t.name)
        if gateway is not None:
            out[t.name]["settled"] = leasehold_settled(gateway)
    return out
