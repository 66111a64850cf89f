"""Pure text rendering shared by the commands: tables, key/value blocks, JSON, small formats.

Nothing here does I/O except `emit_json` / `emit`; every formatter returns a string so the unit
tests compare text. An absent value is shown as "-", never as a blank that reads as "none".
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

MISSING = "-"


def cell(value: Any) -> str:
    if value is None or value == "":
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6f}".rstrip("0").rstrip(".") if value else "0"
    if isinstance(value, list | dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def render_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces; trailing spaces trimmed."""
    text_rows = [[cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in text_rows:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], len(value))
    lines = ["  ".join(v.ljust(widths[i]) for i, v in enumerate(line)).rstrip() for line in [list(headers), *text_rows]]
    return "\n".join(lines)


def render_pairs(pairs: Iterable[tuple[str, Any]]) -> str:
    """`name  value` lines, names padded to one column."""
    items = [(name, cell(value)) for name, value in pairs]
    width = max((len(name) for name, _ in items), default=0)
    return "\n".join(f"{name.ljust(width)}  {value}".rstrip() for name, value in items)


def skipped_text(skipped: Any) -> str:
    """`acct@0 circuit-open, acct-b@1 not-configured`, or "-" when nothing was passed over."""
    if not skipped:
        return MISSING
    return ", ".join(f"{s.get('account_id')}@{s.get('position')} {s.get('code')}" for s in skipped)


def hhmmss(iso: str | None) -> str:
    """The time part of an ISO 8601 UTC stamp (`...T12:34:56.789Z` → `12:34:56Z`)."""
    if not iso or "T" not in iso:
        return MISSING
    clock = iso.split("T", 1)[1]
    return clock.split(".", 1)[0].rstrip("Z") + "Z"


def emit(text: str) -> None:
    if text:
        print(text, flush=True)


def emit_json(payload: Any) -> None:
    print(json.dumps(payload, indent=2, sort_keys=False), flush=True)


def warn(text: str) -> None:
    print(f"leaseholdctl: {text}", file=sys.stderr, flush=True)
