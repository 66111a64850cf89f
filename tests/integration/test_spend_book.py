"""The spend book's rebuild on real files: the month's summaries, the live checkpoint and the
live rows after it give what a running book holds, whatever a restart finds."""

from __future__ import annotations

import json
import os
from pathlib import Path

from controlplane.core.spend import COST, Dim
from controlplane.spend import LIVE_CHECKPOINT, SpendBook
from controlplane.stores import segments
from controlplane.stores.ledger import Ledger
from tests.support.ledgerfiles import FakeClock, stamp_of
from tests.support.rows import row

WINDOWS = ("2026-11", "2026-11-30", "2026-11-30T10")


def open_ledger(state: Path, clock: FakeClock) -> Ledger:
    ledger = Ledger(str(state / "ledger.jsonl"), clock=clock)
    ledger.open()
    return ledger


def feed(ledger: Ledger, book: SpendBook, clock: FakeClock, count: int, step_s: float, **fields) -> None:
    for _ in range(count):
        r = row(stamp_of(clock.now), **fields)
        ledger.stage(r)
        book.add(r)
        ledger.flush()
        clock.advance(step_s)


def snapshot(book: SpendBook, keys: tuple[str, ...] = WINDOWS) -> dict:
    return {
        (key, dim): {k: [round(v, 6) for v in cell] for k, cell in book.fold.cells(key, dim).items()}
        for key in keys
        for dim in Dim
    }


def test_a_rebuilt_book_holds_what_the_running_one_held(tmp_path: Path) -> None:
    clock = FakeClock("2026-11-28T09:00:00")
    ledger = open_ledger(tmp_path, clock)
    running = SpendBook.rebuild(ledger)
    feed(ledger, running, clock, 30, 3600 * 2.5, role="reviewer", cost=0.75)  # rotates across 3 days
    clock.set("2026-11-30T10:00:00")
    feed(ledger, running, clock, 7, 60, repo="acme/web", cost=None, model="house-1")
    ledger.wait_idle()
    assert len(segments.segment_names(str(tmp_path))) >= 2
    rebuilt = SpendBook.rebuild(ledger)
    assert snapshot(rebuilt) == snapshot(running)
    assert rebuilt.loaded["summaries"] == rebuilt.loaded["segments"] >= 2
    ledger.close()


def test_only_the_segments_of_this_month_are_read(tmp_path: Path) -> None:
    clock = FakeClock("2026-10-31T12:00:00")
    ledger = open_ledger(tmp_path, clock)
    book = SpendBook.rebuild(ledger)
    feed(ledger, book, clock, 2, 3600 * 14)  # Oct 31, then Nov 1 (a rotation)
    clock.set("2026-11-02T00:00:30")
    ledger.rotate_if_due(background=False)
    clock.set("2026-11-02T12:00:00")
    rebuilt = SpendBook.rebuild(ledger)
    assert rebuilt.loaded["segments"] == 1  # ledger-20261101, not ledger-20261031
    assert rebuilt.fold.cell("2026-11", Dim.PLATFORM, "")[1] == 1
    ledger.close()


def test_a_missing_summary_is_folded_from_its_rows_and_written_again(tmp_path: Path) -> None:
    clock = FakeClock("2026-11-29T10:00:00")
    ledger = open_ledger(tmp_path, clock)
    book = SpendBook.rebuild(ledger)
    feed(ledger, book, clock, 5, 60, cost=1.0)
    clock.set("2026-11-30T10:00:00")
    ledger.rotate_if_due(background=False)
    summary = tmp_path / "ledger-20261129.spend.json"
    summary.unlink()
    rebuilt = SpendBook.rebuild(ledger)
    assert rebuilt.fold.cell("2026-11", Dim.PLATFORM, "")[COST] == 5.0
    assert (rebuilt.loaded["segments"], rebuilt.loaded["summaries"]) == (1, 0)
    assert json.loads(summary.read_text())["rows"] == 5
    ledger.close()


def test_the_live_checkpoint_spares_a_restart_the_rows_before_it(tmp_path: Path) -> None:
    clock = FakeClock("2026-11-30T10:00:00")
    ledger = open_ledger(tmp_path, clock)
    running = SpendBook.rebuild(ledger)
    feed(ledger, running, clock, 40, 1, principal="p1", cost=0.5)
    running.checkpoint()
    ledger.wait_idle()
    feed(ledger, running, clock, 3, 1, principal="p2", cost=2.0)
    rebuilt = SpendBook.rebuild(ledger)
    assert rebuilt.loaded["live_rows"] == 3
    assert snapshot(rebuilt) == snapshot(running)
    running.checkpoint()  # a second pass reads only what was appended since
    ledger.wait_idle()
    assert json.loads((tmp_path / LIVE_CHECKPOINT).read_text())["rows"] == 43
    assert SpendBook.rebuild(ledger).loaded["live_rows"] == 0
    ledger.close()


def test_a_checkpoint_of_another_file_is_ignored(tmp_path: Path) -> None:
    clock = FakeClock("2026-11-29T10:00:00")
    ledger = open_ledger(tmp_path, clock)
    running = SpendBook.rebuild(ledger)
    feed(ledger, running, clock, 10, 1)
    running.checkpoint()
    ledger.wait_idle()
    clock.set("2026-11-30T10:00:00")
    feed(ledger, running, clock, 2, 1)  # rotates: the checkpoint was of yesterday's file
    ledger.wait_idle()
    rebuilt = SpendBook.rebuild(ledger)
    assert rebuilt.loaded["live_rows"] == 2
    assert snapshot(rebuilt) == snapshot(running)
    # a live file rewritten under the same name (an operator's restore) is not the checkpoint's
    path = tmp_path / "ledger.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[1] + lines[0])
    assert SpendBook.rebuild(ledger).loaded["live_rows"] == 2
    ledger.close()


def test_upkeep_rotates_prunes_and_checkpoints(tmp_path: Path) -> None:
    clock = FakeClock("2026-11-30T23:00:00")
    ledger = open_ledger(tmp_path, clock)
    book = SpendBook.rebuild(ledger)
    feed(ledger, book, clock, 3, 1)
    clock.set("2026-12-01T00:00:05")
    book.tick(force_checkpoint=True)
    ledger.wait_idle()
    assert "ledger-20261130.jsonl.gz" in os.listdir(tmp_path)
    assert book.fold.windows == {} and book.fold.open_hour is None  # November is over
    ledger.close()


def test_a_checkpoint_is_taken_once_the_live_file_grew_enough(tmp_path: Path, monkeypatch) -> None:
    from controlplane import spend

    monkeypatch.setattr(spend, "CHECKPOINT_BYTES", 4096)
    clock = FakeClock("2026-11-30T10:00:00")
    ledger = open_ledger(tmp_path, clock)
    book = SpendBook.rebuild(ledger)
    feed(ledger, book, clock, 2, 1)
    book.tick()
    ledger.wait_idle()
    assert not (tmp_path / LIVE_CHECKPOINT).exists() and book.unchecked_bytes() > 0  # a quiet file: none
    feed(ledger, book, clock, 20, 1)
    book.tick()
    ledger.wait_idle()
    assert json.loads((tmp_path / LIVE_CHECKPOINT).read_text())["rows"] == 22 and book.unchecked_bytes() == 0
    ledger.close()
