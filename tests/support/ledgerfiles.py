"""Reading a state directory's ledger files as they are on disk, for the lifecycle tests: every
row of every segment (gzipped or not) and of the live file, and a clock the tests move."""

from __future__ import annotations

import gzip
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


class FakeClock:
    def __init__(self, stamp: str) -> None:
        self.now = ms(stamp)

    def __call__(self) -> int:
        return self.now

    def set(self, stamp: str) -> None:
        self.now = ms(stamp)

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * 1000)


def ms(stamp: str) -> int:
    return int(datetime.fromisoformat(stamp).replace(tzinfo=UTC).timestamp() * 1000)


def stamp_of(at_ms: int) -> str:
    return datetime.fromtimestamp(at_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def lines_of(path: Path) -> list[bytes]:
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return data.splitlines()


def rows_on_disk(state_dir: Path) -> list[dict[str, Any]]:
    """Every decodable row of every ledger file — segments, the live file, and a `.part` left by
    an unfinished rotation (the authority over a `.gz` of the same name until it is unlinked)."""
    rows: list[dict[str, Any]] = []
    if not state_dir.exists():
        return rows
    names = {p.name for p in state_dir.iterdir()}
    for name in sorted(names):  # segments sort before the live ledger.jsonl
        if name.endswith(".jsonl.gz") and name[:-3] + ".part" in names:
            continue
        if name == "ledger.jsonl" or (name.startswith("ledger-") and name.endswith((".jsonl.gz", ".jsonl.part"))):
            try:
                lines = lines_of(state_dir / name)
            except FileNotFoundError:  # rotated away meanwhile
                continue
            for line in lines:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue
    return rows


def ledger_files(state_dir: Path) -> list[str]:
    return sorted(p for p in os.listdir(state_dir) if p.startswith("ledger"))
