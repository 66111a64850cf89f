"""`SpendBook`: control's spend (SPEC §18) — the pure fold of `core/spend.py`, fed by every
recorded row (one of `ControlService.row_sinks`), rebuilt at startup from the ledger's files.

The rebuild reads, for the windows a view can ask about now (this hour, this day, this month):
- the summary beside every segment written since the month began (`ledger-D.spend.json`,
  written with the segment at rotation; a segment without one is folded from its rows once and
  the summary written, a `.part` a failed rotation left is folded from its rows);
- the live checkpoint `ledger.spend.json` (the fold of `ledger.jsonl` up to a byte offset, taken
  by the ledger's worker thread whenever the live file grew `CHECKPOINT_BYTES` past the last
  one) when it is of this very file;
- the live rows after the checkpoint.
So a restart decodes at most `CHECKPOINT_BYTES` of rows plus one small summary per day, never the
compressed month. A quiet day never pays for a checkpoint (re-reading its rows at a start is
cheaper than folding them twice); a heavy one pays one more decode and fold per row, in the
worker thread, to keep the start bounded. A row is in exactly one of those sources (a rotation is one rename; a segment
and its `.part` are never both read), so a restart never counts a row twice.

`maintain` (run beside the HTTP app) rotates a quiet ledger after midnight, retries a rotation
a failure left unfinished, writes the live checkpoint and forgets windows before this month.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import msgspec

from controlplane.core.budgets import BudgetStatus, Exhausted, LevelBudget, budget_status, exhausted_budgets
from controlplane.core.fleetcells import FleetCells
from controlplane.core.spend import By, SpendFold
from controlplane.core.spendscopes import SpendCells, SpendEntry, TenancyMap, spend_entries
from controlplane.core.windows import Window, key_at, window_at
from controlplane.stores import segments
from controlplane.stores.ledger import Ledger
from controlplane.upkeep import every, while_app_runs
from shared.logging import get_logger
from shared.wire import AttemptRow

log = get_logger("spend")

LIVE_CHECKPOINT = "ledger.spend.json"
TICK_S = 10.0  # how late after midnight a quiet ledger may rotate
CHECKPOINT_BYTES = 32 << 20  # ~50k rows: the most of the live file a start re-reads (~0.3 s)
HEAD_LINE_MAX = 1 << 20  # the checkpoint names its file by inode and by a hash of its first line

_encode = msgspec.json.Encoder().encode


def head_hash(handle: Any) -> str:
    """sha256 of a file's first line (its first row: unique, and fixed once written)."""
    handle.seek(0)
    return hashlib.sha256(handle.readline(HEAD_LINE_MAX)).hexdigest()


class SpendBook:
    def __init__(self, ledger: Ledger, fold: SpendFold | None = None) -> None:
        self.ledger = ledger
        self.fold = fold if fold is not None else SpendFold()
        # What views and budgets read: this host's fold, or in fleet mode the fleet's spend
        # (`FleetCells`, kept by `controlplane/fleet/spend.FleetSpend`).
        self.cells: SpendCells = self.fold
        self.clock: Callable[[], int] = ledger.clock  # one now for the ledger's days and the windows
        self.loaded = {"segments": 0, "summaries": 0, "live_rows": 0}  # what the rebuild read
        self._checkpoint: tuple[int, str, int, segments.Folding] | None = None  # inode, head, offset
        self._checkpointing = False

    def add(self, row: AttemptRow) -> None:
        self.fold.add(row)

    # ---- the rebuild ----------------------------------------------------------------------

    @classmethod
    def rebuild(cls, ledger: Ledger) -> SpendBook:
        book = cls(ledger)
        at_ms = book.clock()
        wanted = {key_at(window, at_ms) for window in Window}
        month_start = key_at(Window.MONTH, at_ms).replace("-", "") + "01"
        state_dir = ledger.state_dir
        for name in segments.segment_names(state_dir):
            if segments.day_of(name) >= month_start:  # a row is written on or after its day
                book._load_segment(state_dir, name, wanted)
        book._load_live(wanted)
        log.info("spend_rebuilt", month=key_at(Window.MONTH, at_ms), **book.loaded)
        return book

    def _load_segment(self, state_dir: str, name: str, wanted: set[str]) -> None:
        self.loaded["segments"] += 1
        part = segments.part_path(state_dir, name)
        if os.path.exists(part):  # a rotation not finished yet: its rows are only here ...
            try:
                segments.fold_file(part, 0, segments.Folding(self.fold))
                return
            except FileNotFoundError:  # ... unless it finished meanwhile: its summary has them
                pass
        path = segments.summary_path(state_dir, name)
        head = segments.read_summary(path)
        if head is None:
            log.warning("spend_summary_missing", segment=name, action="folding its rows")
            folding, _ = segments.fold_file(segments.gz_path(state_dir, name))
            data = _encode(folding.summary(name))
            try:
                segments.write_atomically(path, data)
            except OSError as exc:
                log.error("spend_summary_unwritable", segment=name, error=str(exc))
            head = msgspec.json.decode(data, type=segments.SummaryHead)
        else:
            self.loaded["summaries"] += 1
        segments.merge_windows(self.fold, head, wanted)

    def _load_live(self, wanted: set[str]) -> None:
        try:
            handle = open(self.ledger.path, "rb")
        except FileNotFoundError:
            return
        with handle:
            st = os.fstat(handle.fileno())
            if not stat.S_ISREG(st.st_mode):
                return
            checkpoint = segments.read_summary(os.path.join(self.ledger.state_dir, LIVE_CHECKPOINT))
            start = 0
            if (
                checkpoint is not None
                and checkpoint.inode == st.st_ino
                and checkpoint.offset <= st.st_size
                and checkpoint.head == head_hash(handle)
            ):
                segments.merge_windows(self.fold, checkpoint, wanted)
                start = checkpoint.offset
            handle.seek(start)
            folding = segments.Folding(self.fold)
            segments.fold_lines(handle, start, folding)
            self.loaded["live_rows"] = folding.rows

    # ---- the live checkpoint (the ledger's worker thread) ---------------------------------

    def checkpoint(self) -> None:
        """Queue a refresh of `ledger.spend.json` on the ledger's worker (one at a time)."""
        if not self._checkpointing:
            self._checkpointing = True
            self.ledger.submit(self._write_checkpoint)

    def _write_checkpoint(self) -> None:
        try:
            with open(self.ledger.path, "rb") as handle:  # one file throughout, even if it is rotated now
                st = os.fstat(handle.fileno())
                head = head_hash(handle)
                held = self._checkpoint
                if held is None or held[:2] != (st.st_ino, head) or held[2] > st.st_size:
                    held = (st.st_ino, head, 0, segments.Folding())
                handle.seek(held[2])
                offset = segments.fold_lines(handle, held[2], held[3])
            self._checkpoint = (st.st_ino, head, offset, held[3])
            summary = held[3].summary("live", offset=offset, inode=st.st_ino, head=head)
            segments.write_atomically(
                os.path.join(self.ledger.state_dir, LIVE_CHECKPOINT),
                _encode(msgspec.structs.replace(summary, tail_ids=[])),
            )
        except FileNotFoundError:
            pass  # rotated a moment ago and not written since: nothing to checkpoint
        finally:
            self._checkpointing = False

    # ---- views ----------------------------------------------------------------------------

    def statuses(self, budgets: Iterable[LevelBudget], tenancy: TenancyMap, at_ms: int) -> list[BudgetStatus]:
        return [budget_status(budget, self.cells, tenancy, at_ms) for budget in budgets]

    def exhausted(self, budgets: Iterable[LevelBudget], tenancy: TenancyMap, at_ms: int) -> tuple[Exhausted, ...]:
        """What enforcement asks of a chain's budgets (`ResolvedPolicy.budgets`)."""
        return exhausted_budgets(budgets, self.cells, tenancy, at_ms)

    def spend(self, window: Window, by: By, tenancy: TenancyMap, at_ms: int) -> tuple[int, list[SpendEntry]]:
        key, start_ms, _ = window_at(window, at_ms)
        return start_ms, spend_entries(self.cells, key, by, tenancy)

    def hourly(self, hours: int, by: By, tenancy: TenancyMap, at_ms: int) -> list[tuple[int, bool, list[SpendEntry]]]:
        """The last `hours` hours up to the one in progress, oldest first: (start, held, rows).
        The book holds this month's windows only; an earlier hour is not held (`held` false,
        no rows) — unknown, not zero."""
        _, hour_ms, _ = window_at(Window.HOUR, at_ms)
        _, month_ms, _ = window_at(Window.MONTH, at_ms)
        series = []
        for back in range(hours - 1, -1, -1):
            start_ms = hour_ms - back * 3_600_000
            held = start_ms >= month_ms
            rows = spend_entries(self.cells, key_at(Window.HOUR, start_ms), by, tenancy) if held else []
            series.append((start_ms, held, rows))
        return series

    # ---- upkeep ---------------------------------------------------------------------------

    def tick(self, force_checkpoint: bool = False) -> None:
        now = self.clock()
        self.ledger.rotate_if_due(now)
        self.ledger.resume_rotations()
        self.fold.prune(key_at(Window.MONTH, now))
        if isinstance(self.cells, FleetCells):
            self.cells.prune(key_at(Window.MONTH, now))
        if force_checkpoint or self.unchecked_bytes() >= CHECKPOINT_BYTES:
            self.checkpoint()

    def unchecked_bytes(self) -> int:
        """How much of the live file a start would have to re-read now."""
        try:
            st = os.stat(self.ledger.path)
        except OSError:
            return 0
        held = self._checkpoint
        return st.st_size - (held[2] if held is not None and held[0] == st.st_ino else 0)

    async def maintain(self, tick_s: float = TICK_S) -> None:
        await every(tick_s, self.tick, "spend_upkeep_failed")

    def background(self, _app: object) -> AsyncIterator[None]:
        """The HTTP app's `cleanup_ctx` (`shared.http1.app`): `maintain` runs while the app does."""
        return while_app_runs(self.maintain)
