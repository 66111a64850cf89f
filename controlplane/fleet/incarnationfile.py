"""The fleet data's incarnation this host last registered into, kept in its state directory
(`fleet-incarnation`, 0600), so a host that comes back learns whether Redis lost its data while
it was away (SPEC §16: "losing Redis's data must not lose a promise").

A host that was down when Redis lost its data finds a new incarnation when it claims its id. Its
siblings' live leases may not be registered again yet (each re-registers at its next beat), so
it holds new holders exactly as a host that saw the loss does (`HostRecovery.reregister` with
`after_loss`): otherwise it could fill an account its siblings' leases already fill. A first
start (no file) or an unreadable file is not a loss; the file is hostile input: read strictly.
"""

from __future__ import annotations

import os
import re

from shared.logging import get_logger
from shared.private import create_private

log = get_logger("fleet")

INCARNATION_FILE = "fleet-incarnation"
_VALID = re.compile(rb"[A-Za-z0-9_-]{1,64}")


def returned_after_loss(known: str | None, current: str) -> bool:
    """Did Redis lose its data since this host last registered? Only when it knows an earlier
    incarnation and the fleet's is another now."""
    return known is not None and known != current


def read_known(state_dir: str) -> str | None:
    """The incarnation last registered into, or None (none yet, or a file that does not read)."""
    path = os.path.join(state_dir, INCARNATION_FILE)
    try:
        with open(path, "rb") as handle:
            data = handle.read(128)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("fleet_incarnation_unreadable", path=path, error=type(exc).__name__)
        return None
    if not _VALID.fullmatch(data):
        log.warning("fleet_incarnation_unreadable", path=path, error="not an incarnation id")
        return None
    return data.decode()


def write_known(state_dir: str, incarnation: str) -> None:
    """Keep `incarnation` (renamed into place; a failure is logged, never raised: the next
    registration writes it again)."""
    path = os.path.join(state_dir, INCARNATION_FILE)
    tmp = path + ".tmp"
    try:
        with create_private(tmp) as handle:
            handle.write(incarnation.encode())
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("fleet_incarnation_not_kept", path=path, error=type(exc).__name__)
