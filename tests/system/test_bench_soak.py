"""`make soak` cannot rot silently: a few seconds of each variant's mix, every invariant checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import soak, soak_fleet


def test_short_soak_holds_every_invariant(capsys: pytest.CaptureFixture[str]) -> None:
    status = soak.main(["--seconds", "3", "--seed", "11", "--workers", "4"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "ledger rows == attempts accepted" in out and "FAIL" not in out


def test_short_fleet_soak_survives_its_faults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three pairs, one Redis: a Redis restart, a host SIGKILLed mid-stream and back, a Redis
    pause — and every invariant after. What the fleet soak once found broken (`soak_fleet_checks.REGRESSIONS`) is checked like
    every other invariant."""
    summary_path = tmp_path / "summary.json"
    status = soak_fleet.main(["--seconds", "24", "--seed", "7", "--workers", "3", "--summary", str(summary_path)])
    out = capsys.readouterr().out
    assert status == 0, out
    summary = json.loads(summary_path.read_text())
    runs = summary["faults"]["runs"]
    assert {"redis-restart", "host-kill"} <= {f["kind"] for f in runs}, runs
    assert all(f["recovered"] for f in runs), runs
    assert any(f["kind"] == "host-kill" and f["streams_cut"] >= 1 for f in runs), runs
    assert summary["ok"] and "FAIL" not in out
    hostile = [i for i in summary["invariants"] if i["name"].startswith("hostile writer")]  # SPEC §19
    assert len(hostile) == 2 and all(i["held"] for i in hostile), hostile
    assert all(rows["on_disk"] == rows["expected"] for rows in summary["rows"].values()), summary["rows"]
