"""Policy level names, document validation and tenancy conflicts, by table."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

from controlplane.core.policy import fold_records, tenancy_conflicts
from controlplane.core.policydocs import Level, LevelKind, Problem, check_document, parse_level

ACCOUNTS = ("legacy-anthropic", "legacy-zai-harness", "legacy-openai", "anthropic-team-b")


class NameCase(NamedTuple):
    name: str
    level: Level | None


NAMES = [
    NameCase("platform", Level(kind=LevelKind.PLATFORM)),
    NameCase("org:acme", Level(kind=LevelKind.ORG, tenant="acme")),
    NameCase("team:payments", Level(kind=LevelKind.TEAM, tenant="payments")),
    NameCase("repo:acme/app", Level(kind=LevelKind.REPO, tenant="acme/app")),
    NameCase("binding:acme/app#reviewer", Level(kind=LevelKind.BINDING, tenant="acme/app", worker_role="reviewer")),
    NameCase("platform:x", None),
    NameCase("org:", None),
    NameCase("team:a b", None),
    NameCase("repo:acme/app#role", None),
    NameCase("binding:acme/app", None),
    NameCase("binding:acme/app#", None),
    NameCase("binding:#reviewer", None),
    NameCase("tenant:acme", None),
    NameCase("ORG:acme", None),
    NameCase("", None),
]


@pytest.mark.parametrize("case", NAMES, ids=[c.name or "empty" for c in NAMES])
def test_level_names(case: NameCase) -> None:
    level = parse_level(case.name)
    assert level == case.level
    if level is not None:
        assert level.label == case.name


class DocCase(NamedTuple):
    name: str
    level: str
    doc: Any
    findings: list[tuple[str, Problem, tuple[str, ...]]]  # (field, problem, names)


DOCS = [
    DocCase(
        "every field at platform",
        "platform",
        {
            "account_order": ["anthropic-team-b", "legacy-anthropic"],
            "providers": ["anthropic", "zai-harness"],
            "fallback_on": ["rate-limited", "overloaded"],
            "max_fallback_hops": 2,
            "model_classes": {"top": {"anthropic": "claude-opus-4", "zai-harness": "glm-4.6"}},
            "locks": ["account_order", "model_classes"],
        },
        [],
    ),
    DocCase("empty document clears a level", "repo:acme/app", {}, []),
    DocCase("null means unset", "team:payments", {"account_order": None, "repos": ["acme/app"]}, []),
    DocCase("org lists teams", "org:acme", {"teams": ["payments", "infra"]}, []),
    DocCase("team lists repos", "team:payments", {"repos": ["acme/app"]}, []),
    DocCase(
        "unknown fields, all named",
        "platform",
        {"account_pool": [], "triggers": [], "providers": ["openai"]},
        [("document", Problem.UNKNOWN_FIELD, ("account_pool", "triggers"))],
    ),
    DocCase(
        "repos is unknown outside a team",
        "org:acme",
        {"repos": ["acme/app"]},
        [("document", Problem.UNKNOWN_FIELD, ("repos",))],
    ),
    DocCase(
        "teams is unknown outside an org",
        "binding:acme/app#reviewer",
        {"teams": ["x"]},
        [("document", Problem.UNKNOWN_FIELD, ("teams",))],
    ),
    DocCase(
        "unknown accounts named",
        "team:payments",
        {"account_order": ["legacy-anthropic", "ghost", "spectre"]},
        [("account_order", Problem.UNKNOWN_ACCOUNT, ("ghost", "spectre"))],
    ),
    DocCase(
        "unknown bindings named",
        "platform",
        {"providers": ["anthropic", "bedrock"]},
        [("providers", Problem.UNKNOWN_BINDING, ("bedrock",))],
    ),
    DocCase(
        "unknown model-class binding",
        "platform",
        {"model_classes": {"top": {"vertex": "gemini"}}},
        [("model_classes", Problem.UNKNOWN_BINDING, ("vertex",))],
    ),
    DocCase(
        "unknown conditions named",
        "repo:acme/app",
        {"fallback_on": ["rate-limited", "any", "budget"]},
        [("fallback_on", Problem.UNKNOWN_CONDITION, ("any", "budget"))],
    ),
    DocCase(
        "unknown locks named",
        "org:acme",
        {"locks": ["account_order", "teams", "pair_order"]},
        [("locks", Problem.UNKNOWN_LOCK, ("teams", "pair_order"))],
    ),
    DocCase(
        "duplicates named",
        "platform",
        {"account_order": ["legacy-openai", "legacy-openai"]},
        [("account_order", Problem.DUPLICATE_ENTRY, ("legacy-openai",))],
    ),
    DocCase(
        "several problems at once",
        "platform",
        {"extra": 1, "account_order": ["ghost"], "fallback_on": ["never"]},
        [
            ("document", Problem.UNKNOWN_FIELD, ("extra",)),
            ("account_order", Problem.UNKNOWN_ACCOUNT, ("ghost",)),
            ("fallback_on", Problem.UNKNOWN_CONDITION, ("never",)),
        ],
    ),
    DocCase("hops out of range", "platform", {"max_fallback_hops": -1}, [("document", Problem.INVALID_VALUE, ())]),
    DocCase("wrong type", "platform", {"providers": "anthropic"}, [("document", Problem.INVALID_VALUE, ())]),
    DocCase("not an object", "platform", ["anthropic"], [("document", Problem.INVALID_VALUE, ())]),
    DocCase(
        "malformed repo in tenancy",
        "team:payments",
        {"repos": ["has space"]},
        [("repos", Problem.INVALID_VALUE, ("has space",))],
    ),
    DocCase(
        "budgets, one per window",
        "team:payments",
        {"budgets": [{"window": "hour", "usd": 5}, {"window": "day", "usd": 50.5}, {"window": "month", "usd": 900}]},
        [],
    ),
    DocCase("budgets at a binding", "binding:acme/app#reviewer", {"budgets": [{"window": "day", "usd": 0.01}]}, []),
    DocCase("no budget is no budget", "platform", {"budgets": []}, []),
    DocCase(
        "budget windows named",
        "repo:acme/app",
        {"budgets": [{"window": "week", "usd": 5}, {"window": "day", "usd": 1}, {"window": "year", "usd": 5}]},
        [("budgets", Problem.INVALID_VALUE, ("week", "year"))],
    ),
    DocCase(
        "budget usd above 0",
        "platform",
        {"budgets": [{"window": "day", "usd": 0}, {"window": "month", "usd": -3}]},
        [("budgets", Problem.INVALID_VALUE, ("day", "month"))],
    ),
    DocCase(
        "one budget per window",
        "org:acme",
        {"budgets": [{"window": "day", "usd": 5}, {"window": "day", "usd": 9}, {"window": "hour", "usd": 1}]},
        [("budgets", Problem.DUPLICATE_ENTRY, ("day",))],
    ),
    DocCase(
        "every budget problem at once",
        "platform",
        {"budgets": [{"window": "fortnight", "usd": 5}, {"window": "day", "usd": -1}, {"window": "day", "usd": 2}]},
        [
            ("budgets", Problem.INVALID_VALUE, ("fortnight",)),
            ("budgets", Problem.INVALID_VALUE, ("day",)),
            ("budgets", Problem.DUPLICATE_ENTRY, ("day",)),
        ],
    ),
    DocCase(
        "budget usd is a number",
        "platform",
        {"budgets": [{"window": "day", "usd": "50"}]},
        [("document", Problem.INVALID_VALUE, ())],
    ),
    DocCase(
        "budget entry fields are closed",
        "platform",
        {"budgets": [{"window": "day", "usd": 5, "currency": "EUR"}]},
        [("document", Problem.INVALID_VALUE, ())],
    ),
    DocCase(
        "headroom floor 0..50, lockable",
        "team:payments",
        {"min_headroom_percent": 50, "locks": ["min_headroom_percent"], "repos": ["acme/app"]},
        [],
    ),
    DocCase(
        "headroom floor above 50", "platform", {"min_headroom_percent": 51}, [("document", Problem.INVALID_VALUE, ())]
    ),
    DocCase(
        "headroom floor negative", "platform", {"min_headroom_percent": -1}, [("document", Problem.INVALID_VALUE, ())]
    ),
    DocCase(
        "headroom floor is an integer",
        "platform",
        {"min_headroom_percent": 12.5},
        [("document", Problem.INVALID_VALUE, ())],
    ),
    DocCase(
        "budgets cannot be locked",
        "platform",
        {"locks": ["budgets"], "budgets": [{"window": "day", "usd": 5}]},
        [("locks", Problem.UNKNOWN_LOCK, ("budgets",))],
    ),
]


@pytest.mark.parametrize("case", DOCS, ids=[c.name for c in DOCS])
def test_check_document(case: DocCase) -> None:
    level = parse_level(case.level)
    assert level is not None
    checked = check_document(level, case.doc, ACCOUNTS)
    assert [(f.field, f.problem, f.names) for f in checked.findings] == case.findings
    assert (checked.document is None) == bool(case.findings)


def test_tenancy_conflicts_name_the_members_and_their_holder() -> None:
    state = fold_records(
        [
            {"seq": 1, "name": "team:payments", "document": {"repos": ["acme/pay"]}},
            {"seq": 2, "name": "org:acme", "document": {"teams": ["payments"]}},
        ]
    )
    infra = parse_level("team:infra")
    claim = check_document(infra, {"repos": ["acme/ops", "acme/pay"]}, ACCOUNTS).document
    found = tenancy_conflicts(state, infra, claim)
    assert [(f.field, f.problem, f.names) for f in found] == [("repos", Problem.TENANCY_CONFLICT, ("acme/pay",))]
    assert "team:payments" in found[0].detail
    # the holder rewriting its own listing is no conflict
    payments = parse_level("team:payments")
    assert (
        tenancy_conflicts(state, payments, check_document(payments, {"repos": ["acme/pay"]}, ACCOUNTS).document) == ()
    )
    other_org = parse_level("org:globex")
    found = tenancy_conflicts(state, other_org, check_document(other_org, {"teams": ["payments"]}, ACCOUNTS).document)
    assert [f.names for f in found] == [("payments",)]
