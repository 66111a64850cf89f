"""Which models an account serves (SPEC §4): its `models` globs, matched case-sensitively.

One matcher for both daemons: control's registry picks candidates with it, the data plane
holds each request on a lease to it (SPEC §12), so a lease can reach exactly what a mint for
that model could have selected. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

# Answers kept per (model, globs): the data plane asks on every request, for a handful of
# models. Bounded: past this many pairs (a worker inventing model names) it starts over.
MEMO_MAX = 4096
_memo: dict[tuple[str, tuple[str, ...]], bool] = {}


def serves_model(model: str, globs: Iterable[str]) -> bool:
    """True when any of `globs` matches `model` (fnmatch syntax, case-sensitive)."""
    key = (model, globs if isinstance(globs, tuple) else tuple(globs))
    found = _memo.get(key)
    if found is None:
        if len(_memo) >= MEMO_MAX:
            _memo.clear()
        found = _memo[key] = any(fnmatchcase(model, pattern) for pattern in key[1])
    return found
