"""`shared/private.py` (SPEC §19): files created 0600 by `os.open` itself and directories
tightened to 0700, whatever the umask and whatever was there before."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.private import create_private, open_append, private_dir


@pytest.fixture(autouse=True)
def wide_umask() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_a_private_dir_is_created_and_an_existing_one_tightened(tmp_path: Path) -> None:
    fresh, wide = tmp_path / "a" / "b", tmp_path / "wide"
    wide.mkdir(mode=0o777)
    os.chmod(wide, 0o777)
    for path in (fresh, wide):
        private_dir(str(path))
        assert mode(path) == 0o700


def test_create_private_replaces_what_was_there(tmp_path: Path) -> None:
    stale, planted, target = tmp_path / "x.tmp", tmp_path / "y.tmp", tmp_path / "elsewhere"
    stale.write_bytes(b"old")
    os.chmod(stale, 0o666)
    target.write_bytes(b"keep")
    planted.symlink_to(target)
    for path in (stale, planted):
        with create_private(str(path)) as handle:
            handle.write(b"new")
        assert mode(path) == 0o600 and not path.is_symlink() and path.read_bytes() == b"new"
    assert target.read_bytes() == b"keep"  # a planted symlink is never written through


def test_open_append_creates_0600_and_appends(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    for line in (b"a\n", b"b\n"):
        fd = open_append(str(path))
        os.write(fd, line)
        os.close(fd)
    assert mode(path) == 0o600 and path.read_bytes() == b"a\nb\n"
