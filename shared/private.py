"""Files and directories only this user may read (SPEC §19, "Local state").

Control's state directory holds who holds which key (digests), every attempt row, the chains
and the spend; the data plane's runtime directory its socket. Every file either daemon creates
there is created with mode 0600 by `os.open` itself — never created with the process umask and
chmodded afterwards, which leaves a window in which another user may open it — and the
directories are 0700, tightened at start even when they already existed.

- `private_dir(path)`: create (0700) or tighten an existing directory to 0700.
- `create_private(path)`: a new file (a temporary one, renamed into place afterwards) as a
  binary file object; whatever was at `path` (a stale temporary, a planted file or symlink) is
  removed first, and `O_EXCL | O_NOFOLLOW` create it afresh, so its mode is this call's.
- `open_append(path)`: a descriptor appending to `path`, created 0600 if it does not exist.
"""

from __future__ import annotations

import os
from typing import BinaryIO

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_dir(path: str) -> None:
    os.makedirs(path, mode=DIR_MODE, exist_ok=True)
    os.chmod(path, DIR_MODE)


def create_private(path: str) -> BinaryIO:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    return os.fdopen(fd, "wb")


def open_append(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
