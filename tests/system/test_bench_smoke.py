"""`make bench` cannot rot silently: the smallest real run, every phase, every column.

Real processes on loopback (stub, minimal proxy, control, data plane, generator), the `smoke`
preset (a few requests per phase). No wall-clock limit is asserted — only that every phase
produced figures for every column, nothing failed, and the report and files are written.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench import rpc_rate
from bench.report import render
from bench.run import PLANS, measure, write
from bench.stats import AIMS


def test_smallest_run_measures_every_phase_for_every_column(tmp_path: Path) -> None:
    results = measure(
        PLANS["smoke"], tmp_path / "work", pin=True, peers=False, peers_spec=None, say=lambda _message: None
    )
    names = results["targets"]
    assert names == ["direct", "minimal-proxy", "leasehold"]
    for phase in ("held", "saturation", "fixed_rate", "stream_rate", "streams"):
        for name in names:
            assert results[phase][name]["errors"] == {}, (phase, name, results[phase][name])
    for name in names:
        assert results["saturation"][name]["rps"] > 0
        assert results["fixed_rate"][name]["latency_ms"]["n"] > 0
        assert results["stream_rate"][name]["ttfb_ms"]["n"] > 0
        assert results["streams"][name]["streams"] == PLANS["smoke"].streams
        assert results["held"][name]["streams_open"] == PLANS["smoke"].held_streams
    assert results["held"]["leasehold"]["settled"] is True
    assert results["streams"]["leasehold"]["settled"] is True
    assert results["mint_revoke"]["iterations"] == PLANS["smoke"].mint_iterations
    assert results["mint_revoke"]["errors"] == {}
    assert results["start"]["gateway_ready_ms"]["n"] == 1
    assert results["rpc"]["one_way_msgs_per_s"] > 0 and results["rpc"]["round_trips_per_s"] > 0
    assert results["derived"]["leasehold"]["errors"] == 0
    assert {a["name"] for a in results["aims"]} == {a.name for a in AIMS}
    assert all(a["measured"] is not None for a in results["aims"])
    assert set(results["versions"]) == {"python", "aiohttp", "msgspec", "uvloop"}
    assert results["machine"]["cores"] >= 1
    for name in ("direct", "naive relay", "leasehold"):  # the WebSocket phase (SPEC §20)
        assert results["websocket"][name]["messages"] == PLANS["smoke"].ws_events
        assert results["websocket"][name]["msgs_per_s_one_socket"] > 0
    assert "aim_met" in results["websocket"]["derived"]

    latest = write(results, tmp_path / "results")
    assert json.loads(latest.read_text())["started_at"] == results["started_at"]
    assert len(list((tmp_path / "results").glob("run-*.json"))) == 1
    table = render(results)
    assert all(name in table for name in names)


def test_rpc_rate_counts_messages_over_a_real_socket() -> None:
    figures = rpc_rate.run(duration_s=0.5, in_flight=4, sequential=3)  # 0.05 s counted nothing once under load
    assert figures["one_way_msgs_per_s"] > 0 and figures["round_trips_per_s"] > 0
    assert figures["sequential_round_trip_ms"]["n"] == 3


def test_control_rows_measures_the_per_attempt_path() -> None:
    import asyncio

    from bench import control_rows

    assert asyncio.run(control_rows.measure(50, rounds=1))[0] > 0  # asserts inside: every row acked
    loop_us, cpu_us = asyncio.run(control_rows.measure(50, rounds=1, traces=True))  # and no span dropped
    assert loop_us > 0 and cpu_us > 0


def test_ab_runs_every_column_in_both_layouts(capsys) -> None:
    import os

    import pytest

    from bench import ab

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("bench.ab pins generator and servers apart: needs two CPUs")
    for layout in ([], ["--alone", "--windows"]):  # slices (the default), and one process per window
        assert ab.main(["--rounds", "1", "--seconds", "1", *layout]) == 0  # 0.2 s measured no request once under load
        out = capsys.readouterr().out
        assert "minimal-proxy" in out and "leasehold" in out and "dataplane" in out
        assert "leasehold / minimal-proxy" in out and "over 1 rounds; rounds " in out  # per-round ratios
