"""Pure arithmetic of the benchmark: percentiles, summaries, ratios and the aims verdicts.

Rule: nothing here measures or prints; numbers in, numbers (or verdicts) out, so the report
can be recomputed from `bench/results/*.json` and every rule is tested by a table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import msgspec


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile `q` (0..100) of an already sorted sequence."""
    if not sorted_values:
        return math.nan
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    rank = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    frac = rank - low
    return float(sorted_values[low] + (sorted_values[high] - sorted_values[low]) * frac)


def summarize_ms(seconds: Sequence[float]) -> dict[str, float | int]:
    """p50/p90/p99/max/mean of durations given in seconds, reported in milliseconds."""
    ordered = sorted(seconds)
    if not ordered:
        return {"n": 0}
    return {
        "n": len(ordered),
        "p50": round(percentile(ordered, 50) * 1000, 4),
        "p90": round(percentile(ordered, 90) * 1000, 4),
        "p99": round(percentile(ordered, 99) * 1000, 4),
        "max": round(ordered[-1] * 1000, 4),
        "mean": round(sum(ordered) / len(ordered) * 1000, 4),
    }


def ratio(value: float | None, reference: float | None) -> float | None:
    """value / reference, or None when either is missing or the reference is zero."""
    if value is None or reference is None or reference == 0 or _bad(value) or _bad(reference):
        return None
    return round(value / reference, 4)


def added(value: float | None, reference: float | None) -> float | None:
    """value - reference (e.g. added latency in ms), or None when either is missing."""
    if value is None or reference is None or _bad(value) or _bad(reference):
        return None
    return round(value - reference, 4)


def _bad(x: float) -> bool:
    return isinstance(x, float) and math.isnan(x)


def per_stream_kib(rss_before_kib: int | None, rss_held_kib: int | None, streams: int) -> float | None:
    """RSS growth per open stream, KiB; None if there was nothing to divide by."""
    if rss_before_kib is None or rss_held_kib is None or streams <= 0:
        return None
    return round((rss_held_kib - rss_before_kib) / streams, 2)


# ---- rounds: one phase measured in several interleaved rounds, merged -------------------------


def merge_counts(parts: Sequence[dict[str, int]]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for part in parts:
        for key, n in part.items():
            merged[key] = merged.get(key, 0) + n
    return merged


def mean_shares(parts: Sequence[dict[str, float | None]]) -> dict[str, float | None]:
    """Per-key mean of CPU shares over rounds (a key missing or None in a round is skipped)."""
    keys = [k for part in parts for k in part]
    out: dict[str, float | None] = {}
    for key in dict.fromkeys(keys):
        values = [p[key] for p in parts if p.get(key) is not None]
        out[key] = round(sum(values) / len(values), 3) if values else None  # type: ignore[arg-type]
    return out


def merge_saturation(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Equal-length rounds: mean throughput; the latency of the median round; summed errors."""
    ordered = sorted(rounds, key=lambda r: r["rps"])
    median = ordered[len(ordered) // 2]
    rps = round(sum(r["rps"] for r in rounds) / len(rounds), 1)
    cpu = mean_shares([r.get("cpu") or {} for r in rounds])
    switches = merge_counts(
        [{k: v for k, v in (r.get("context_switches") or {}).items() if v is not None} for r in rounds]
    )
    requests = sum(r["requests"] for r in rounds)
    return {
        **median,
        "rps": rps,
        "requests": requests,
        "rounds_rps": [r["rps"] for r in rounds],
        "errors": merge_counts([r["errors"] for r in rounds]),
        "cpu": cpu,
        "context_switches": switches,
        "cpu_us_per_request": {k: round(v / rps * 1e6, 1) for k, v in cpu.items() if v and rps},
        "switches_per_request": {k: round(v / requests, 2) for k, v in switches.items() if requests},
    }


def merge_rate(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Pool every round's samples, then summarise (raw samples are dropped from the result)."""
    latency = [x for r in rounds for x in r.get("raw_latency_s", ())]
    ttfb = [x for r in rounds for x in r.get("raw_ttfb_s", ())]
    first = {k: v for k, v in rounds[0].items() if not k.startswith("raw_")}
    return {
        **first,
        "requests": sum(r["requests"] for r in rounds),
        "latency_ms": summarize_ms(latency),
        "ttfb_ms": summarize_ms(ttfb),
        "errors": merge_counts([r["errors"] for r in rounds]),
        "extra_connections": sum(r.get("extra_connections", 0) for r in rounds),
        "cpu": mean_shares([r.get("cpu") or {} for r in rounds]),
        "rounds": len(rounds),
    }


# ---- aims (issue 9) ----------------------------------------------------------------------------


class Aim(msgspec.Struct, frozen=True, kw_only=True):
    """One aim: `measured` compared to `limit` by `op` (">=" or "<=")."""

    name: str
    unit: str
    op: str
    limit: float | None


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    unit: str
    op: str
    limit: float | None
    measured: float | None
    met: bool | None  # None: not measured in this run


AIMS = (
    Aim(name="throughput vs minimal proxy", unit="x", op=">=", limit=1.0),
    Aim(name="added p50 at fixed rate", unit="ms", op="<=", limit=0.5),
    Aim(name="added p99 at fixed rate", unit="ms", op="<=", limit=2.0),
    Aim(name="data plane RSS per open stream", unit="KiB", op="<=", limit=40.0),
    Aim(name="start to ready", unit="s", op="<=", limit=1.0),
    Aim(name="mint + revoke p50", unit="ms", op="<=", limit=2.0),
    Aim(name="added TTFB p50 for streams", unit="ms", op="<=", limit=1.0),
    Aim(name="errors", unit="count", op="<=", limit=0.0),
)


def judge(aim: Aim, measured: float | None) -> Verdict:
    if measured is None or _bad(measured) or aim.limit is None:
        met = None
    elif aim.op == ">=":
        met = measured >= aim.limit
    else:
        met = measured <= aim.limit
    return Verdict(name=aim.name, unit=aim.unit, op=aim.op, limit=aim.limit, measured=measured, met=met)


def verdicts(measured: dict[str, float | None]) -> list[Verdict]:
    """A verdict for every aim, by aim name (an aim missing from `measured` is not judged)."""
    return [judge(aim, measured.get(aim.name)) for aim in AIMS]


def fmt(value: Any, digits: int = 2) -> str:
    """Compact human formatting for the table: thousands separators, fixed decimals, '—'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)
