"""`make soak` cannot rot silently: a few seconds of the mix, every invariant checked."""

from __future__ import annotations

import pytest

from bench import soak


def test_short_soak_holds_every_invariant(capsys: pytest.CaptureFixture[str]) -> None:
    status = soak.main(["--seconds", "3", "--seed", "11", "--workers", "4"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "ledger rows == attempts accepted" in out and "FAIL" not in out
