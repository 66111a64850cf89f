"""What a lease may reach (SPEC §12), by table: the model its request names against the globs
of its account (SPEC §4), matched exactly as the registry matches them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from shared.models import serves_model


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    globs: tuple[str, ...]
    expect: bool


GLOB_CASES = [
    Case("prefix glob", "claude-haiku-4-5", ("claude-haiku-*",), True),
    Case("a sibling family is not served", "claude-opus-4-1", ("claude-haiku-*",), False),
    Case("another wire's model is not served", "gpt-5", ("claude-haiku-*",), False),
    Case("any glob of several", "o3-mini", ("gpt-*", "o[0-9]*", "codex-*"), True),
    Case("character class", "o1", ("o[0-9]*",), True),
    Case("character class refuses", "omni", ("o[0-9]*",), False),
    Case("exact name", "gpt-5-mini", ("gpt-5-mini",), True),
    Case("exact name is not a prefix", "gpt-5-mini-2026", ("gpt-5-mini",), False),
    Case("case matters, as in the registry", "Claude-haiku-4-5", ("claude-haiku-*",), False),
    Case("no globs serve nothing", "claude-haiku-4-5", (), False),
    Case("empty model is served by a bare star only", "", ("*",), True),
]


@pytest.mark.parametrize("case", GLOB_CASES, ids=lambda c: c.name)
def test_serves_model(case: Case) -> None:
    assert serves_model(case.model, case.globs) is case.expect


def test_the_registry_matches_through_the_same_function() -> None:
    from controlplane.registry import AccountSpec
    from shared.codes import AuthStyle, Binding

    spec = AccountSpec(
        id="a-1",
        display_name="a",
        provider_binding=Binding.ANTHROPIC,
        base_url="http://x",
        auth_style=AuthStyle.X_API_KEY,
        credential_env="GATEWAY_A_KEY",
        models=("claude-haiku-*",),
    )
    for case in GLOB_CASES:
        if case.globs == ("claude-haiku-*",):
            assert spec.serves(case.model) is case.expect, case.name
    assert spec.route().models == ("claude-haiku-*",)  # the data plane gets the same globs


# ---- the data plane's decision ---------------------------------------------------------------

from dataplane.scope import Reach, reach  # noqa: E402

HAIKU = ("claude-haiku-*",)


@dataclass(frozen=True)
class ReachCase:
    name: str
    model: str | None
    readable: bool
    globs: tuple[str, ...] | None
    expect: Reach


REACH_CASES = [
    ReachCase("a served model", "claude-haiku-4-5", True, HAIKU, Reach.PERMITTED),
    ReachCase("a model the account does not serve", "claude-opus-4-1", True, HAIKU, Reach.NOT_SERVED),
    ReachCase("another wire's model", "gpt-5", True, HAIKU, Reach.NOT_SERVED),
    ReachCase("no model named (GET /v1/models, a body without one)", None, True, HAIKU, Reach.NO_MODEL),
    ReachCase("a body in an encoding the gateway cannot read", None, False, HAIKU, Reach.UNREADABLE),
    ReachCase("a route without globs (older control) is not checked", "claude-opus-4-1", True, None, Reach.UNCHECKED),
    ReachCase("nor is an unreadable body on such a route", None, False, None, Reach.UNCHECKED),
]


@pytest.mark.parametrize("case", REACH_CASES, ids=lambda c: c.name)
def test_reach(case: ReachCase) -> None:
    verdict = reach(case.model, case.readable, case.globs)
    assert verdict is case.expect
    assert verdict.refused is (case.expect in (Reach.NOT_SERVED, Reach.UNREADABLE))
