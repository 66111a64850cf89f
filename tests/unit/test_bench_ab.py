"""`bench.ab`'s per-round ratios and `bench.baseline`'s reading of bench/BASELINE."""

from __future__ import annotations

import subprocess

import pytest

from bench import baseline
from bench.ab import combine, mirrored, ratio_line, round_ratios, slice_order
from bench.loadgen import slice_windows


def test_ratios_pair_each_round_with_its_own_round() -> None:
    assert round_ratios([100.0, 90.0, 120.0], [50.0, 100.0, 120.0]) == [2.0, 0.9, 1.0]


def test_ratios_refuse_rounds_of_different_counts() -> None:
    with pytest.raises(ValueError):
        round_ratios([1.0, 2.0], [1.0])


def test_the_line_prints_median_range_and_every_round() -> None:
    line = ratio_line("leasehold / base", [0.9, 1.1, 1.0])
    assert "1.000x (0.900–1.100) over 3 rounds" in line
    assert line.endswith("rounds 0.900 1.100 1.000")


def test_the_baseline_names_a_commit_of_this_repository() -> None:
    commit = baseline.baseline_commit()
    done = subprocess.run(["git", "-C", str(baseline.REPO), "cat-file", "-t", commit], capture_output=True, text=True)
    if done.returncode != 0 and "not a git repository" in done.stderr:
        pytest.skip("not a git checkout")
    assert done.stdout.strip() == "commit"


def test_a_round_runs_the_columns_there_and_back() -> None:
    assert mirrored(["a", "b", "c"], 0) == ["a", "b", "c", "c", "b", "a"]
    assert mirrored(["a", "b", "c"], 1) == ["c", "b", "a", "a", "b", "c"]


def test_a_linear_drift_over_the_round_cancels_in_the_ratio() -> None:
    # Two columns of equal speed, the machine slowing by 10 % a window: windows a b b a.
    speeds = [100.0, 90.0, 80.0, 70.0]
    a = combine([(speeds[0], {"dataplane": 1.0}), (speeds[3], {"dataplane": 3.0})])
    b = combine([(speeds[1], {}), (speeds[2], {})])
    assert round_ratios([a[0]], [b[0]]) == [1.0]
    assert a[1] == {"dataplane": 2.0}


def test_slices_repeat_the_mirrored_round_until_each_column_has_its_share() -> None:
    assert slice_order(2, 0, 4) == [0, 1, 1, 0, 0, 1, 1, 0]
    assert slice_order(3, 1, 3) == [2, 1, 0, 0, 1, 2, 2, 1, 0, 0, 1, 2]  # 3 rounded up to 4 each
    order = slice_order(3, 0, 10)
    assert [order.count(c) for c in range(3)] == [10, 10, 10]


def test_a_slice_measures_after_its_settle() -> None:
    assert slice_windows([0, 1], 0.5, 0.1) == [(0, 0.4), (1, 0.4)]
    with pytest.raises(ValueError):
        slice_windows([0], 0.5, 0.5)  # nothing left to measure
