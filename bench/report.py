"""From raw phase results to figures: ratios against direct-to-stub, the aims, the table.

Rule: pure — the whole report is a function of the results dict that `bench/run.py` writes to
`bench/results/latest.json`, so a saved run can be re-rendered (`python -m bench.report FILE`)
and the rules are tested without running a benchmark.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from bench.stats import Verdict, added, fmt, ratio, verdicts

# Which process carries a column's per-stream memory (the proxy, or the stub itself).
MAIN_DAEMON = {"direct": "stub", "minimal-proxy": "minimal-proxy", "leasehold": "dataplane", "litellm": "litellm"}


def _get(d: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def error_count(results: dict[str, Any], target: str) -> int:
    total = 0
    for phase in ("held", "saturation", "fixed_rate", "stream_rate", "streams"):
        errors = _get(results, phase, target, "errors") or {}
        total += sum(errors.values())
    if target == "leasehold":
        total += sum((_get(results, "mint_revoke", "errors") or {}).values())
    return total


def derive(results: dict[str, Any]) -> dict[str, Any]:
    """Per-target ratios and added figures vs direct, and the aims measured for Leasehold."""
    names = results["targets"]
    out: dict[str, Any] = {}
    rps_direct = _get(results, "saturation", "direct", "rps")
    for name in names:
        row: dict[str, Any] = {}
        rps = _get(results, "saturation", name, "rps")
        row["throughput_vs_direct"] = ratio(rps, rps_direct)
        row["throughput_vs_minimal"] = ratio(rps, _get(results, "saturation", "minimal-proxy", "rps"))
        for q in ("p50", "p90", "p99"):
            row[f"added_latency_{q}_ms"] = added(
                _get(results, "fixed_rate", name, "latency_ms", q),
                _get(results, "fixed_rate", "direct", "latency_ms", q),
            )
            row[f"added_stream_ttfb_{q}_ms"] = added(
                _get(results, "stream_rate", name, "ttfb_ms", q), _get(results, "stream_rate", "direct", "ttfb_ms", q)
            )
        for metric in ("ttfb_ms", "total_ms"):
            for q in ("p50", "p99"):
                mine = _get(results, "streams", name, metric, q)
                base = _get(results, "streams", "direct", metric, q)
                row[f"streams_{metric}_{q}_vs_direct"] = ratio(mine, base)
                row[f"streams_{metric}_{q}_added"] = added(mine, base)
        daemon = "dataplane" if name.startswith("leasehold") else MAIN_DAEMON.get(name, name)
        row["kib_per_stream"] = _get(results, "held", name, "daemons", daemon, "kib_per_stream")
        row["errors"] = error_count(results, name)
        out[name] = row
    return out


def aims(results: dict[str, Any], derived: dict[str, Any]) -> list[Verdict]:
    lh = derived.get("leasehold", {})
    ready_ms = _get(results, "start", "gateway_ready_ms", "p50")
    return verdicts(
        {
            "throughput vs minimal proxy": lh.get("throughput_vs_minimal"),
            "added p50 at fixed rate": lh.get("added_latency_p50_ms"),
            "added p99 at fixed rate": lh.get("added_latency_p99_ms"),
            "data plane RSS per open stream": lh.get("kib_per_stream"),
            "start to ready": None if ready_ms is None else round(ready_ms / 1000, 3),
            "mint + revoke p50": _get(results, "mint_revoke", "mint_revoke_ms", "p50"),
            "added TTFB p50 for streams": lh.get("added_stream_ttfb_p50_ms"),
            "errors": lh.get("errors"),
        }
    )


# ---- the table --------------------------------------------------------------------------------


def _cell(value: Any, base: Any, mode: str, name: str) -> str:
    text = fmt(value)
    if name == "direct" or value is None or mode == "plain":
        return text
    if mode == "ratio":
        r = ratio(value, base)
        return f"{text} ({fmt(r)}x)" if r is not None else text
    a = added(value, base)
    return f"{text} ({'+' if a is not None and a >= 0 else ''}{fmt(a)})" if a is not None else text


def _row(results: dict[str, Any], names: list[str], label: str, path: tuple[str, ...], mode: str, width: int) -> str:
    phase, rest = path[0], path[1:]
    base = _get(results, phase, "direct", *rest)
    cells = [_cell(_get(results, phase, n, *rest), base, mode, n) for n in names]
    return f"  {label:<40}" + "".join(f"{c:>{width}}" for c in cells)


def render(results: dict[str, Any]) -> str:
    names: list[str] = results["targets"]
    width = max([24] + [len(n) + 2 for n in names])
    machine, versions = results["machine"], results["versions"]
    plan = results["plan"]
    lines = [
        f"Leasehold benchmark {results['started_at']} — {machine['cores']} cores; {results['layout']}",
        "versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        "ratios (x) and added figures (+) are against direct-to-stub measured in this run",
        "",
        f"  {'':<40}" + "".join(f"{n:>{width}}" for n in names),
        f"Non-streaming, {plan['body_bytes']} B request bodies",
    ]
    r = lambda label, path, mode: lines.append(_row(results, names, label, path, mode, width))  # noqa: E731
    r(f"saturation throughput, req/s ({plan['saturate_connections']} conns)", ("saturation", "rps"), "ratio")
    for q in ("p50", "p90", "p99"):
        r(f"latency {q} at {plan['rate']} req/s, ms", ("fixed_rate", "latency_ms", q), "added")
    lines.append(f"Streams, {plan['stream_chunks']} events")
    for q in ("p50", "p99"):
        r(f"TTFB {q} at {plan['stream_rate']} streams/s, ms", ("stream_rate", "ttfb_ms", q), "added")
    for metric, label in (("ttfb_ms", "TTFB"), ("total_ms", "total")):
        for q in ("p50", "p99"):
            r(f"{label} {q}, {plan['streams']} concurrent, ms", ("streams", metric, q), "ratio")
    lines.append(f"Memory, {plan['held_streams']} concurrent open streams")
    for name in names:
        for daemon, fig in (_get(results, "held", name, "daemons") or {}).items():
            if daemon == "stub" and name != "direct":
                continue
            label = name if daemon == name else f"{name} / {daemon}"
            lines.append(
                f"  {label:<40}idle {fmt(_kib_mib(fig['rss_idle_kib']))} MiB, "
                f"held {fmt(_kib_mib(fig['rss_held_kib']))} MiB, "
                f"peak {fmt(_kib_mib(fig['peak_rss_kib']))} MiB, "
                f"{fmt(fig['kib_per_stream'])} KiB/stream"
            )
    lines += _control_lines(results)
    lines += _hostile_lines(results.get("hostile"))
    lines += _websocket_lines(results)
    for peer, info in (results.get("peers") or {}).items():
        if "unavailable" in info:
            lines.append(f"  {peer + ' (peer)':<40}unavailable: {info['unavailable'][:200]}")
        else:
            lines.append(f"  {peer + ' start to ready, ms':<40}{fmt(info['start_to_ready_s'] * 1000)} ({info['spec']})")
    lines += _generator_lines(results, names)
    lines.append("Aims (issue 9; Leasehold)")
    for v in results.get("aims") or []:
        mark = {True: "met", False: "MISSED", None: "not measured"}[v["met"]]
        lines.append(
            f"  {v['name']:<40}{fmt(v['measured']):>12} {v['unit']:<6} aim {v['op']} {fmt(v['limit'])}  {mark}"
        )
    return "\n".join(lines)


def _kib_mib(kib: int | None) -> float | None:
    return None if kib is None else kib / 1024


def _control_lines(results: dict[str, Any]) -> list[str]:
    mr, st, rpc = results.get("mint_revoke") or {}, results.get("start") or {}, results.get("rpc") or {}
    return [
        "Control",
        f"  {'mint + revoke round trip, ms':<40}p50 {fmt(_get(mr, 'mint_revoke_ms', 'p50'))}, "
        f"p99 {fmt(_get(mr, 'mint_revoke_ms', 'p99'))} (mint p50 {fmt(_get(mr, 'mint_ms', 'p50'))}, "
        f"revoke p50 {fmt(_get(mr, 'revoke_ms', 'p50'))}; n={fmt(mr.get('iterations'))})",
        f"  {'start to ready, ms':<40}p50 {fmt(_get(st, 'gateway_ready_ms', 'p50'))}, "
        f"max {fmt(_get(st, 'gateway_ready_ms', 'max'))} (control alone p50 "
        f"{fmt(_get(st, 'control_ready_ms', 'p50'))}; n={fmt(st.get('trials'))})",
        f"  {'RPC, messages/s (one process)':<40}one-way {fmt(rpc.get('one_way_msgs_per_s'))}, "
        f"acked round trips {fmt(rpc.get('round_trips_per_s'))} ({fmt(rpc.get('in_flight'))} in flight), "
        f"one acked row p50 {fmt(_get(rpc, 'sequential_round_trip_ms', 'p50'), 3)} ms",
    ]


def _hostile_lines(h: dict[str, Any] | None) -> list[str]:
    """The hostile phase (issue 21), when it ran."""
    if not h:
        return []
    alone, bombs, rss = h["healthz_alone"], h["healthz_under_bombs"], h["idle_rss"]
    return [
        "Hostile workers (SPEC §19)",
        f"  {'/healthz p99, alone / 8 gzip bombs, ms':<40}{fmt(alone['p99_ms'])} / {fmt(bombs['p99_ms'])} "
        f"(p50 {fmt(alone['p50_ms'])} / {fmt(bombs['p50_ms'])}; {bombs['bombs_answered']} bombs answered)",
        f"  {'RSS per idle connection, KiB':<40}{fmt(rss['kib_per_idle_connection'])} "
        f"({rss['connections']} connections; 24 GiB holds {rss['cap_24_gib_holds']})",
        f"  {'connection cap held':<40}{h['cap']['refused_503']} of {h['cap']['opened']} refused 503 "
        f"(cap {h['cap']['cap']})",
        f"  {'stalled client slot freed after, s':<40}{fmt(h['stalled_slot']['slot_freed_after_s'])} "
        f"(stall bound {h['stalled_slot']['stall_bound_s']} s; waited up to "
        f"{h['stalled_slot']['waited_up_to_s']} s)",
    ]


def _generator_lines(results: dict[str, Any], names: list[str]) -> list[str]:
    lines = ["CPU during saturation: share of one core (µs per request, context switches per request)"]
    for name in names:
        sat = _get(results, "saturation", name) or {}
        cpu, us = sat.get("cpu") or {}, sat.get("cpu_us_per_request") or {}
        switches = sat.get("switches_per_request") or {}
        servers = ", ".join(
            f"{k} {fmt(v)} ({fmt(us.get(k), 0)} µs, {fmt(switches.get(k), 1)} cs)"
            for k, v in cpu.items()
            if k != "generator"
        )
        lines.append(f"  {name:<{max(22, len(name) + 1)}}generator {fmt(cpu.get('generator'))}; {servers}")
    check = results.get("generator_check") or {}
    lines.append(f"  verdict: {check.get('verdict', '—')}")
    noise = results.get("noise") or {}
    if noise:
        lines.append(
            f"  other processes on this machine used {fmt(noise.get('foreign_cpu_share'))} of "
            f"{fmt(noise.get('cores'))} cores during the run (load avg {noise.get('loadavg_start')} → "
            f"{noise.get('loadavg_end')})"
        )
        if is_noisy(noise):
            lines.append(
                "  WARNING: the machine was busy with other work; latency tails and throughput are "
                "skewed — rerun with --wait-quiet on a quiet machine"
            )
    return lines


def is_noisy(noise: dict[str, Any]) -> bool:
    share = noise.get("foreign_cpu_share")
    return share is not None and share > noise.get("quiet_threshold", 0.25)


def generator_check(results: dict[str, Any]) -> dict[str, Any]:
    """The generator was not the bottleneck if it stayed under 90% of its core in every column."""
    shares = {n: _get(results, "saturation", n, "cpu", "generator") for n in results["targets"]}
    worst = max((v for v in shares.values() if v is not None), default=None)
    ok = worst is not None and worst < 0.9
    verdict = (
        f"generator at most {fmt(worst)} of its core: not the bottleneck"
        if ok
        else f"generator reached {fmt(worst)} of its core: figures may be generator-bound"
    )
    return {"generator_cpu": shares, "max": worst, "not_bottleneck": ok, "verdict": verdict}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    with open(args[0] if args else "bench/results/latest.json") as fh:
        print(render(json.load(fh)))
    return 0


if __name__ == "__main__":
    sys.exit(main())


def _websocket_lines(results: dict[str, Any]) -> list[str]:
    """The WebSocket phase (SPEC §20): its own three columns (bench/websocket.py)."""
    ws = results.get("websocket")
    if not ws:
        return []
    n = ws["plan"]["sockets"]
    cols = ("direct", "naive relay", "leasehold")
    lines = ["Responses WebSocket, per message (direct / naive aiohttp relay / Leasehold)"]
    for label, key in (
        ("latency p50, ms", "p50_ms"),
        ("latency p99, ms", "p99_ms"),
        ("msgs/s, one socket", "msgs_per_s_one_socket"),
        (f"msgs/s, {n} sockets", f"msgs_per_s_{n}_sockets"),
        ("RSS per open socket, KiB", "rss_kib_per_open_socket"),
    ):
        lines.append(f"  {label:<40}" + " / ".join(fmt(ws[c][key]) for c in cols))
    d = ws["derived"]
    lines.append(
        f"  {'added p50 / p99 over direct, ms':<40}naive {fmt(d['naive_added_p50_ms'])} / "
        f"{fmt(d['naive_added_p99_ms'])}, Leasehold {fmt(d['leasehold_added_p50_ms'])} / "
        f"{fmt(d['leasehold_added_p99_ms'])} (aim: ≤ naive + 0.2 ms: "
        f"{'met' if d['aim_met'] else 'not met'})"
    )
    return lines
