"""The benchmark's arithmetic and verdicts, by table, on hand-written results."""

from __future__ import annotations

import math
from typing import NamedTuple

import pytest

from bench.procs import Layout
from bench.report import aims, derive, generator_check, render
from bench.stats import AIMS, added, judge, per_stream_kib, percentile, ratio, summarize_ms


class Pct(NamedTuple):
    name: str
    values: list[float]
    q: float
    expect: float


PCTS = [
    Pct("single", [4.0], 99, 4.0),
    Pct("median of odd", [1.0, 2.0, 3.0], 50, 2.0),
    Pct("interpolated", [0.0, 10.0], 90, 9.0),
    Pct("max", [1.0, 2.0, 3.0], 100, 3.0),
    Pct("min", [1.0, 2.0, 3.0], 0, 1.0),
]


@pytest.mark.parametrize("case", PCTS, ids=[c.name for c in PCTS])
def test_percentile(case: Pct) -> None:
    assert percentile(case.values, case.q) == pytest.approx(case.expect)


def test_percentile_of_nothing_is_nan_and_summary_is_empty() -> None:
    assert math.isnan(percentile([], 50))
    assert summarize_ms([]) == {"n": 0}
    assert summarize_ms([0.001, 0.003])["p50"] == pytest.approx(2.0)


class Arith(NamedTuple):
    name: str
    value: float | None
    reference: float | None
    ratio: float | None
    added: float | None


ARITH = [
    Arith("plain", 2.0, 4.0, 0.5, -2.0),
    Arith("missing value", None, 4.0, None, None),
    Arith("zero reference", 2.0, 0.0, None, 2.0),
    Arith("nan", math.nan, 1.0, None, None),
]


@pytest.mark.parametrize("case", ARITH, ids=[c.name for c in ARITH])
def test_ratio_and_added(case: Arith) -> None:
    assert (ratio(case.value, case.reference), added(case.value, case.reference)) == (case.ratio, case.added)


def test_per_stream_kib() -> None:
    assert per_stream_kib(1000, 3000, 100) == 20.0
    assert per_stream_kib(None, 3000, 100) is None and per_stream_kib(1000, 3000, 0) is None


class Judge(NamedTuple):
    aim: str
    measured: float | None
    met: bool | None


JUDGE = [
    Judge("throughput vs minimal proxy", 1.2, True),
    Judge("throughput vs minimal proxy", 0.4, False),
    Judge("added p50 at fixed rate", 0.5, True),
    Judge("added p50 at fixed rate", 0.51, False),
    Judge("start to ready", None, None),
    Judge("errors", 0, True),
    Judge("errors", 1, False),
]


@pytest.mark.parametrize("case", JUDGE, ids=[f"{c.aim}={c.measured}" for c in JUDGE])
def test_aims_are_judged_by_their_direction(case: Judge) -> None:
    aim = next(a for a in AIMS if a.name == case.aim)
    assert judge(aim, case.measured).met is case.met


def test_layout_gives_the_generator_its_own_core() -> None:
    assert Layout.decide({0, 1}, pin=True) == Layout(generator_cpus=(0,), server_cpus=(1,))
    assert Layout.decide({2, 3, 5}, pin=True) == Layout(generator_cpus=(2,), server_cpus=(3, 5))
    assert Layout.decide({0}, pin=True).generator_cpus is None
    assert Layout.decide({0, 1}, pin=False).server_cpus is None


def _results() -> dict:
    def lat(p50: float, p99: float) -> dict:
        return {"n": 100, "p50": p50, "p90": p50, "p99": p99, "max": p99, "mean": p50}

    def held(name: str, kib: int) -> dict:
        return {
            "streams_open": 10,
            "errors": {},
            "daemons": {
                name: {
                    "rss_idle_kib": 1000,
                    "rss_held_kib": 1000 + 10 * kib,
                    "peak_rss_kib": 2000,
                    "kib_per_stream": kib,
                }
            },
        }

    return {
        "started_at": "2026-01-01T00:00:00Z",
        "machine": {"cores": 2},
        "layout": "pinned",
        "versions": {"python": "3.11"},
        "targets": ["direct", "minimal-proxy", "leasehold"],
        "plan": {
            "body_bytes": 2048,
            "saturate_connections": 64,
            "rate": 200,
            "stream_chunks": 50,
            "stream_rate": 50,
            "streams": 200,
            "held_streams": 10,
        },
        "saturation": {
            "direct": {"rps": 1000.0, "errors": {}, "cpu": {"generator": 0.5, "stub": 1.0}},
            "minimal-proxy": {"rps": 250.0, "errors": {}, "cpu": {"generator": 0.2}},
            "leasehold": {"rps": 200.0, "errors": {"http-503": 2}, "cpu": {"generator": 0.1}},
        },
        "fixed_rate": {
            "direct": {"latency_ms": lat(0.4, 1.0), "errors": {}},
            "minimal-proxy": {"latency_ms": lat(0.8, 2.0), "errors": {}},
            "leasehold": {"latency_ms": lat(1.0, 4.0), "errors": {}},
        },
        "stream_rate": {
            n: {"ttfb_ms": lat(v, v), "errors": {}}
            for n, v in (("direct", 0.5), ("minimal-proxy", 1.0), ("leasehold", 1.2))
        },
        "streams": {
            n: {"ttfb_ms": lat(v, v), "total_ms": lat(10 * v, 10 * v), "errors": {}}
            for n, v in (("direct", 2.0), ("minimal-proxy", 4.0), ("leasehold", 5.0))
        },
        "held": {
            "direct": held("stub", 20.0),
            "minimal-proxy": held("minimal-proxy", 30.0),
            "leasehold": held("dataplane", 45.0),
        },
        "mint_revoke": {"mint_revoke_ms": lat(1.5, 3.0), "errors": {}},
        "start": {"gateway_ready_ms": lat(800.0, 900.0)},
    }


def test_derived_figures_are_ratios_and_differences_against_direct() -> None:
    results = _results()
    derived = derive(results)
    lh = derived["leasehold"]
    assert lh["throughput_vs_direct"] == 0.2 and lh["throughput_vs_minimal"] == 0.8
    assert lh["added_latency_p50_ms"] == pytest.approx(0.6)
    assert lh["added_stream_ttfb_p50_ms"] == pytest.approx(0.7)
    assert lh["streams_ttfb_ms_p50_vs_direct"] == 2.5
    assert lh["kib_per_stream"] == 45.0 and lh["errors"] == 2
    verdicts = {v.name: v.met for v in aims(results, derived)}
    assert verdicts == {
        "throughput vs minimal proxy": False,
        "added p50 at fixed rate": False,
        "added p99 at fixed rate": False,
        "data plane RSS per open stream": False,
        "start to ready": True,
        "mint + revoke p50": True,
        "added TTFB p50 for streams": True,
        "errors": False,
    }


def test_generator_check_flags_a_busy_generator() -> None:
    results = _results()
    assert generator_check(results)["not_bottleneck"] is True
    results["saturation"]["direct"]["cpu"]["generator"] = 0.97
    assert generator_check(results)["not_bottleneck"] is False


def test_table_names_every_column_and_every_aim() -> None:
    results = _results()
    results["derived"] = derive(results)
    results["aims"] = [
        {"name": v.name, "unit": v.unit, "op": v.op, "limit": v.limit, "measured": v.measured, "met": v.met}
        for v in aims(results, results["derived"])
    ]
    table = render(results)
    for name in results["targets"]:
        assert name in table
    for aim in AIMS:
        assert aim.name in table
    assert "250 (0.25x)" in table and "MISSED" in table


def test_rounds_merge_pools_samples_and_sums_errors() -> None:
    from bench.stats import merge_rate, merge_saturation

    sat = merge_saturation(
        [
            {
                "rps": 100.0,
                "requests": 100,
                "errors": {"http-503": 1},
                "cpu": {"generator": 0.2, "stub": 0.9},
                "latency_ms": {"p50": 1.0},
            },
            {
                "rps": 300.0,
                "requests": 300,
                "errors": {"http-503": 2},
                "cpu": {"generator": 0.4, "stub": None},
                "latency_ms": {"p50": 3.0},
            },
            {"rps": 200.0, "requests": 200, "errors": {}, "cpu": {"generator": 0.3}, "latency_ms": {"p50": 2.0}},
        ]
    )
    assert sat["rps"] == 200.0 and sat["requests"] == 600 and sat["errors"] == {"http-503": 3}
    assert sat["latency_ms"] == {"p50": 2.0}  # the median round's
    assert sat["cpu"] == {"generator": 0.3, "stub": 0.9}
    rate = merge_rate(
        [
            {"requests": 2, "raw_latency_s": [0.001, 0.003], "raw_ttfb_s": [0.001, 0.001], "errors": {}},
            {"requests": 1, "raw_latency_s": [0.002], "raw_ttfb_s": [0.002], "errors": {"stream-cut": 1}},
        ]
    )
    assert rate["requests"] == 3 and rate["latency_ms"]["p50"] == pytest.approx(2.0)
    assert rate["errors"] == {"stream-cut": 1} and not any(k.startswith("raw_") for k in rate)


def test_peer_column_and_an_unavailable_peer_are_reported() -> None:
    results = _results()
    results["derived"] = derive(results)
    results["aims"] = []
    results["peers"] = {"litellm": {"spec": "litellm[proxy]==1", "unavailable": "pip failed: no network"}}
    assert "unavailable: pip failed: no network" in render(results)
