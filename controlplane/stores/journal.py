"""Replaying a JSON-lines journal (the key table's, the lease decisions'): one entry a line, a
line that does not decode (a crash mid-append, a version skew, a hostile edit) logged, counted and
skipped, never fatal."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TypeVar

import msgspec

from shared.logging import get_logger

log = get_logger("journal")

T = TypeVar("T")


def replay(
    path: str, decode: Callable[[bytes], T], skipped_event: str, on_skip: Callable[[], None] | None = None
) -> Iterator[T]:
    """Every decodable entry of the journal at `path`, in order (none when it does not exist);
    `on_skip` is called once per line skipped."""
    if not os.path.exists(path):
        return
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, 1):
            try:
                yield decode(line)
            except msgspec.DecodeError:
                log.warning(skipped_event, line=number, path=os.path.basename(path))
                if on_skip is not None:
                    on_skip()
