"""What a lease may reach (SPEC §12): the models its account serves. Pure.

A request whose body names a model that the lease's account does not serve (no glob of the
account's `models` matches, SPEC §4) is refused 400 `model-not-permitted`, with no upstream
call: an account declared for `claude-haiku-*` never bills an Opus call. So is a body the
gateway cannot read the model of (a `Content-Encoding` it cannot inflate): the rule cannot be
checked, so it is not waived. A request that names no model — `GET /v1/models`, a body
without a string `model` — is not this rule's business and goes on (the upstream answers a
request that needs a model and lacks one). An account route without globs comes from a
control daemon older than them and is not checked.
"""

from __future__ import annotations

from enum import StrEnum

from shared.models import serves_model


class Reach(StrEnum):
    PERMITTED = "permitted"  # a glob of the account matches the model
    NOT_SERVED = "not-served"  # refused: the account does not serve the model
    UNREADABLE = "unreadable"  # refused: the body's model cannot be read
    NO_MODEL = "no-model"  # the request names no model
    UNCHECKED = "unchecked"  # the route carries no globs

    @property
    def refused(self) -> bool:
        return self in (Reach.NOT_SERVED, Reach.UNREADABLE)


def reach(model: str | None, readable: bool, globs: tuple[str, ...] | None) -> Reach:
    """May a request naming `model` (None: names none) go to an account serving `globs`?"""
    if globs is None:
        return Reach.UNCHECKED
    if not readable:
        return Reach.UNREADABLE
    if model is None:
        return Reach.NO_MODEL
    return Reach.PERMITTED if serves_model(model, globs) else Reach.NOT_SERVED


MEMO_MAX = 512  # (model, globs) verdicts kept by `refuses`; cleared when full
MEMO_MODEL_MAX = 256  # a longer model name is decided every time, never kept
_refusals: dict[tuple[str | None, tuple[str, ...] | None], bool] = {}


def refuses(model: str | None, globs: tuple[str, ...] | None) -> bool:
    """`reach(model, True, globs).refused` for a readable body, memoized: a lease's requests
    name the same model all day, and the verdict is one dict lookup instead of ~6k
    instructions of globbing and enum tests (issue 27)."""
    key = (model, globs)
    found = _refusals.get(key)
    if found is None:
        found = reach(model, True, globs).refused
        if model is None or len(model) <= MEMO_MODEL_MAX:
            if len(_refusals) >= MEMO_MAX:
                _refusals.clear()
            _refusals[key] = found
    return found
