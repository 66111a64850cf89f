"""The ledger's rotated segments and the spend summaries kept beside them (SPEC §18).

Each UTC day's `ledger.jsonl` becomes `ledger-YYYYMMDD.jsonl.gz` (the day its rows were
written; a second file for a day already rotated — a clock set back — is `ledger-YYYYMMDD-N`),
with `ledger-YYYYMMDD.spend.json` beside it: the spend fold of its rows per window
(`core.spend`), and the attempt ids of its tail for the ledger's deduplication. A restart reads
the summaries, never the compressed rows.

A rotation is five steps after the ledger renamed `ledger.jsonl` to `ledger-D.jsonl.part`, each
leaving the directory in a state the next open finishes (`recover`): the `.part` file is the
authority until it is unlinked, so a crash at any point redoes the steps from it and never
counts a row twice or loses one:

  compressed      `.part` → `ledger-D.jsonl.gz.tmp` (fsynced), its rows folded on the way
  summarised      the summary → `ledger-D.spend.json.tmp` (fsynced)
  summary-placed  renamed to `ledger-D.spend.json`
  placed          `.gz.tmp` renamed to `ledger-D.jsonl.gz`, directory fsynced
  unlinked        the `.part` removed, directory fsynced

`on_step(name)` is called after each step (tests inject crashes there). Retention removes a
segment older than `GATEWAY_LEDGER_RETENTION_DAYS`; its summary is kept at least as long as a
month view may need it (`SUMMARY_MIN_DAYS`).
"""

from __future__ import annotations

import gzip
import os
import re
from collections import deque
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta

import msgspec

from controlplane.core.spend import SpendFold
from shared.logging import get_logger
from shared.private import create_private
from shared.wire import Usage

log = get_logger("ledger")

SEGMENT_RE = re.compile(r"^ledger-(\d{8})(?:-(\d+))?\.jsonl\.gz$")
PART_RE = re.compile(r"^ledger-(\d{8}(?:-\d+)?)\.jsonl\.part$")
TMP_RE = re.compile(r"^ledger-\d{8}(?:-\d+)?\.(?:jsonl\.gz|spend\.json)\.tmp$")
SUMMARY_RE = re.compile(r"^ledger-(\d{8})(?:-\d+)?\.spend\.json$")
SUMMARY_VERSION = 1
SUMMARY_MIN_DAYS = 32  # a month view after a restart needs every summary of the month
GZIP_LEVEL = 6
TAIL_IDS = 32_768  # as many ids as the ledger's deduplication window
WRITE_BATCH_BYTES = 1 << 20

OnStep = Callable[[str], None]
SummaryCell = tuple[str, str | None, float, int, int, int, int, int, int]


def _no_step(_: str) -> None:
    pass


class LedgerRow(msgspec.Struct, kw_only=True):
    """What the fold and the deduplication read of a ledger line (the rest is skipped)."""

    attempt_id: str
    finished_at: str | None = None
    repo_slug: str = ""
    worker_role: str | None = None
    account_id: str = ""
    served_model: str | None = None
    requested_model: str | None = None
    principal_id: str = ""
    cost_usd: float | None = None
    cost_reason: str | None = None
    usage: Usage | None = None


class Summary(msgspec.Struct, kw_only=True):
    version: int = SUMMARY_VERSION
    segment: str
    rows: int
    windows: dict[str, list[SummaryCell]]
    offset: int = 0  # the live checkpoint: bytes of `ledger.jsonl` folded ...
    inode: int = 0  # ... of this file ...
    head: str = ""  # ... whose first line is this one
    tail_ids: list[str] = []


class SummaryHead(msgspec.Struct, kw_only=True):
    """A summary as a restart reads it: windows left undecoded until asked for, no tail ids."""

    version: int
    segment: str
    rows: int
    windows: dict[str, msgspec.Raw]
    offset: int = 0
    inode: int = 0
    head: str = ""


class SummaryTail(msgspec.Struct, kw_only=True):
    tail_ids: list[str] = []


_decode_row = msgspec.json.Decoder(LedgerRow).decode
_decode_head = msgspec.json.Decoder(SummaryHead).decode
_decode_tail = msgspec.json.Decoder(SummaryTail).decode
_decode_cells = msgspec.json.Decoder(list[SummaryCell]).decode
_encode = msgspec.json.Encoder().encode


# ---- names --------------------------------------------------------------------------------


def gz_path(state_dir: str, name: str) -> str:
    return os.path.join(state_dir, f"ledger-{name}.jsonl.gz")


def part_path(state_dir: str, name: str) -> str:
    return os.path.join(state_dir, f"ledger-{name}.jsonl.part")


def summary_path(state_dir: str, name: str) -> str:
    return os.path.join(state_dir, f"ledger-{name}.spend.json")


def day_of(name: str) -> str:
    return name[:8]


def utc_day(at_ms: int) -> str:
    return datetime.fromtimestamp(at_ms // 1000, UTC).strftime("%Y%m%d")


def day_start_ms(day: str) -> int:
    return int(datetime.strptime(day, "%Y%m%d").replace(tzinfo=UTC).timestamp() * 1000)


def has_parts(state_dir: str) -> bool:
    return any(PART_RE.match(entry) for entry in os.listdir(state_dir))


def free_name(state_dir: str, day: str) -> str:
    """`day`, or `day-N` when a segment (or a rotation in progress) already holds that day."""
    name, n = day, 0
    while os.path.exists(gz_path(state_dir, name)) or os.path.exists(part_path(state_dir, name)):
        n += 1
        name = f"{day}-{n}"
    return name


def segment_names(state_dir: str) -> list[str]:
    """Every rotated segment, oldest first (a `.part` still counts: it is the authority)."""
    names = set()
    for entry in os.listdir(state_dir):
        if (m := SEGMENT_RE.match(entry)) is not None:
            names.add(m.group(1) + (f"-{m.group(2)}" if m.group(2) else ""))
        elif (m := PART_RE.match(entry)) is not None:
            names.add(m.group(1))
    return sorted(names, key=lambda n: (n[:8], int(n[9:] or 0)))


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- rows ---------------------------------------------------------------------------------


class Folding:
    """Rows of one segment as they are read: the fold, the row count and the tail of ids."""

    def __init__(self, fold: SpendFold | None = None, rows: int = 0) -> None:
        self.fold = fold if fold is not None else SpendFold()
        self.rows = rows
        self.tail: deque[str] = deque(maxlen=TAIL_IDS)

    def line(self, line: bytes) -> None:
        try:
            row = _decode_row(line)
        except msgspec.DecodeError:
            return  # a torn write: kept in the file as it is, counted nowhere
        self.fold.add(row)
        self.tail.append(row.attempt_id)
        self.rows += 1

    def summary(self, segment: str, **identity: int | str) -> Summary:
        windows = {
            key: [(str(dim), k, *cell) for dim, cells in window.items() for k, cell in cells.items()]
            for key, window in self.fold.summary().items()
        }
        return Summary(
            segment=segment,
            rows=self.rows,
            windows=windows,  # type: ignore[arg-type]
            tail_ids=list(self.tail),
            **identity,  # type: ignore[arg-type]
        )


def fold_file(path: str, start: int = 0, folding: Folding | None = None) -> tuple[Folding, int]:
    """Fold the whole lines of `path` (plain or gzipped) from byte `start`; returns the folding
    and the offset it reached."""
    folding = folding if folding is not None else Folding()
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as handle:
            return folding, fold_lines(handle, start, folding)
    with open(path, "rb") as handle:
        handle.seek(start)
        return folding, fold_lines(handle, start, folding)


def fold_lines(lines: Iterable[bytes], start: int, folding: Folding) -> int:
    """Fold whole lines (one still being written is left for the next read); the end offset."""
    end = start
    for line in lines:
        if not line.endswith(b"\n"):
            break
        end += len(line)
        folding.line(line)
    return end


def write_atomically(path: str, data: bytes, on_step: OnStep = _no_step, step: str = "") -> None:
    """`path.tmp`, fsynced, renamed over `path`; `on_step(step)` runs between the two."""
    tmp = path + ".tmp"
    with create_private(tmp) as handle:  # 0600 from its creation (SPEC §19)
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    if step:
        on_step(step)
    os.replace(tmp, path)


def read_summary(path: str) -> SummaryHead | None:
    try:
        with open(path, "rb") as handle:
            head = _decode_head(handle.read())
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError) as exc:
        log.warning("spend_summary_unreadable", path=path, error=str(exc))
        return None
    return head if head.version == SUMMARY_VERSION else None


def read_tail_ids(path: str) -> list[str]:
    try:
        with open(path, "rb") as handle:
            return _decode_tail(handle.read()).tail_ids
    except (OSError, msgspec.DecodeError):
        return []


def merge_windows(fold: SpendFold, head: SummaryHead, keys: set[str]) -> None:
    """Add the summary's cells of the windows `keys` (the ones a view may ask for) to `fold`."""
    for key in keys:
        raw = head.windows.get(key)
        if raw is not None:
            fold.merge(key, ((dim, k, cell) for dim, k, *cell in _decode_cells(raw)))


# ---- rotation -----------------------------------------------------------------------------


def finish_rotation(state_dir: str, name: str, on_step: OnStep = _no_step) -> Summary:
    """Steps 2..6 of a rotation whose `.part` exists (see the module's docstring)."""
    part, gz = part_path(state_dir, name), gz_path(state_dir, name)
    folding = Folding()
    with open(part, "rb") as source, create_private(gz + ".tmp") as raw:
        with gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=GZIP_LEVEL, mtime=0) as out:
            batch: list[bytes] = []
            size = 0
            for line in source:
                folding.line(line)
                batch.append(line)
                size += len(line)
                if size >= WRITE_BATCH_BYTES:
                    out.write(b"".join(batch))
                    batch, size = [], 0
            out.write(b"".join(batch))
        raw.flush()
        os.fsync(raw.fileno())  # after the gzip trailer, which closing the GzipFile wrote
    on_step("compressed")
    summary = folding.summary(name)
    write_atomically(summary_path(state_dir, name), _encode(summary), on_step, "summarised")
    on_step("summary-placed")
    os.replace(gz + ".tmp", gz)
    fsync_dir(state_dir)
    on_step("placed")
    os.unlink(part)
    fsync_dir(state_dir)
    on_step("unlinked")
    log.info("ledger_rotated", segment=os.path.basename(gz), rows=folding.rows)
    return summary


def recover(state_dir: str, on_step: OnStep = _no_step) -> list[str]:
    """Finish every rotation a crash interrupted (its `.part` is still there), from the `.part`;
    remove temporary files left without one. Returns the segments finished."""
    entries = os.listdir(state_dir)
    parts = sorted(m.group(1) for e in entries if (m := PART_RE.match(e)) is not None)
    for entry in entries:
        if TMP_RE.match(entry):
            os.unlink(os.path.join(state_dir, entry))
    for name in parts:
        log.warning("ledger_rotation_resumed", segment=name)
        finish_rotation(state_dir, name, on_step)
    return parts


def sweep(state_dir: str, today: str, retention_days: int) -> list[str]:
    """Remove segments older than `retention_days` before `today`, and summaries older than
    the longer of that and `SUMMARY_MIN_DAYS`. Returns the files removed."""
    start = datetime.strptime(today, "%Y%m%d")
    keep_from = (start - timedelta(days=retention_days)).strftime("%Y%m%d")
    summaries_from = (start - timedelta(days=max(retention_days, SUMMARY_MIN_DAYS))).strftime("%Y%m%d")
    removed = []
    for entry in sorted(os.listdir(state_dir)):
        m = SEGMENT_RE.match(entry) or SUMMARY_RE.match(entry)
        if m is None:
            continue
        limit = keep_from if entry.endswith(".gz") else summaries_from
        if m.group(1) < limit:
            os.unlink(os.path.join(state_dir, entry))
            removed.append(entry)
    if removed:
        fsync_dir(state_dir)
        log.info("ledger_segments_expired", removed=removed, retention_days=retention_days)
    return removed
