"""Which models an account serves (SPEC §4): its `models` globs, matched case-sensitively.

One matcher for both daemons: control's registry picks candidates with it, the data plane
holds each request on a lease to it (SPEC §12), so a lease can reach exactly what a mint for
that model could have selected. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase


def serves_model(model: str, globs: Iterable[str]) -> bool:
    """True when any of `globs` matches `model` (fnmatch syntax, case-sensitive)."""
    return any(fnmatchcase(model, pattern) for pattern in globs)
