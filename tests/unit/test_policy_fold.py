"""The policy fold by table (seed 003's "fold tables"): levels, locks, ceilings, model classes.

Every case names the documents present (by level label), the (repo, role) resolved, and what
the resolved policy must say — values and the provenance of the deciding level.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec
import pytest

from controlplane.core.policy import CEILING, DEFAULT, Ceiling, PolicyState, fold_records, resolve
from controlplane.core.policydocs import LevelDocument, PolicyField
from shared.codes import Condition

ALL = frozenset(Condition)
CEIL = Ceiling(fallback_on=ALL, max_fallback_hops=2)
REPO, ROLE = "acme/pay", "reviewer"
TENANCY = {"org:acme": {"teams": ["payments"]}, "team:payments": {"repos": [REPO]}}
LEVELS = ("platform", "org:acme", "team:payments", f"repo:{REPO}", f"binding:{REPO}#{ROLE}")
PLATFORM, ORG, TEAM, REPO_L, BINDING = LEVELS


def state_of(docs: dict[str, dict[str, Any]]) -> PolicyState:
    merged: dict[str, dict[str, Any]] = {k: dict(v) for k, v in TENANCY.items()}
    for label, doc in docs.items():
        merged.setdefault(label, {}).update(doc)
    records = [{"seq": n, "name": label, "document": doc} for n, (label, doc) in enumerate(merged.items(), 1)]
    state = fold_records(records)
    assert not state.unreadable
    return state


def fold(docs: dict[str, dict[str, Any]], repo: str = REPO, role: str | None = ROLE, ceiling: Ceiling = CEIL):
    return resolve(state_of(docs), repo, role, ceiling, revision=7)


class Case(NamedTuple):
    name: str
    docs: dict[str, dict[str, Any]]
    field: str
    value: Any
    provenance: str


VALUE_OF = {
    "account_order": lambda label: (f"acct-{label}",),
    "providers": lambda label: ("anthropic",) if label in (PLATFORM, TEAM, BINDING) else ("openai",),
    "fallback_on": lambda label: (
        frozenset({Condition.RATE_LIMITED}) if label in (ORG, REPO_L) else frozenset({Condition.OVERLOADED})
    ),
    "max_fallback_hops": lambda label: LEVELS.index(label) % 3,
    "min_headroom_percent": lambda label: 5 + 10 * LEVELS.index(label),  # SPEC §22
}


def doc_value(field: str, label: str) -> Any:
    value = VALUE_OF[field](label)
    return sorted(value) if isinstance(value, frozenset) else list(value) if isinstance(value, tuple) else value


def only(field: str, label: str, **more: dict) -> dict[str, dict[str, Any]]:
    docs = {label: {field: doc_value(field, label)}}
    docs.update(more)
    return docs


# Each level setting each field alone: that level answers, with its own label.
SINGLE = [
    Case(f"{field} set only at {label}", only(field, label), field, VALUE_OF[field](label), label)
    for field in VALUE_OF
    for label in LEVELS
]


def setters(field: str, *labels: str, locks: dict[str, list[str]] | None = None) -> dict[str, dict[str, Any]]:
    docs: dict[str, dict[str, Any]] = {label: {field: doc_value(field, label)} for label in labels}
    for label, locked in (locks or {}).items():
        docs.setdefault(label, {})["locks"] = locked
    return docs


def locks_at(label: str, field: str) -> dict[str, list[str]]:
    return {label: [field]}


F = "account_order"
CASES = SINGLE + [
    Case("no policy: registry order", {}, F, None, DEFAULT),
    Case("no policy: every provider", {}, "providers", None, DEFAULT),
    Case("no policy: fallback_on is the ceiling", {}, "fallback_on", ALL, CEILING),
    Case("no policy: hops are the ceiling", {}, "max_fallback_hops", 2, CEILING),
    Case("most specific setter wins", setters(F, PLATFORM, TEAM, BINDING), F, (f"acct-{BINDING}",), BINDING),
    Case("repo beats team and org", setters(F, ORG, TEAM, REPO_L), F, (f"acct-{REPO_L}",), REPO_L),
    # a lock vetoes every more specific setter ...
    Case(
        "platform lock vetoes every tenant",
        setters(F, PLATFORM, ORG, TEAM, REPO_L, BINDING, locks=locks_at(PLATFORM, F)),
        F,
        (f"acct-{PLATFORM}",),
        PLATFORM,
    ),
    Case(
        "org lock vetoes team, repo, binding",
        setters(F, PLATFORM, ORG, TEAM, REPO_L, BINDING, locks=locks_at(ORG, F)),
        F,
        (f"acct-{ORG}",),
        ORG,
    ),
    Case(
        "team lock vetoes repo and binding",
        setters(F, PLATFORM, ORG, TEAM, REPO_L, BINDING, locks=locks_at(TEAM, F)),
        F,
        (f"acct-{TEAM}",),
        TEAM,
    ),
    Case(
        "repo lock vetoes binding",
        setters(F, TEAM, REPO_L, BINDING, locks=locks_at(REPO_L, F)),
        F,
        (f"acct-{REPO_L}",),
        REPO_L,
    ),
    Case(
        "binding lock binds nothing below",
        setters(F, TEAM, BINDING, locks=locks_at(BINDING, F)),
        F,
        (f"acct-{BINDING}",),
        BINDING,
    ),
    # ... but never a less specific one: the lock answers at-or-below itself
    Case(
        "team lock without a value: the org answers",
        setters(F, ORG, REPO_L, BINDING, locks=locks_at(TEAM, F)),
        F,
        (f"acct-{ORG}",),
        ORG,
    ),
    Case(
        "org lock without a value: the platform answers",
        setters(F, PLATFORM, TEAM, locks=locks_at(ORG, F)),
        F,
        (f"acct-{PLATFORM}",),
        PLATFORM,
    ),
    Case(
        "platform lock without a value: the default stands",
        setters(F, ORG, TEAM, locks=locks_at(PLATFORM, F)),
        F,
        None,
        DEFAULT,
    ),
    Case(
        "team lock without any setter at or below it: default",
        setters(F, REPO_L, locks=locks_at(TEAM, F)),
        F,
        None,
        DEFAULT,
    ),
    Case(
        "least specific lock wins over a more specific one",
        setters(F, PLATFORM, ORG, TEAM, locks={ORG: [F], TEAM: [F]}),
        F,
        (f"acct-{ORG}",),
        ORG,
    ),
    Case(
        "a lock on another field changes nothing",
        setters(F, ORG, BINDING, locks=locks_at(ORG, "providers")),
        F,
        (f"acct-{BINDING}",),
        BINDING,
    ),
    Case(
        "platform lock on fallback_on",
        setters("fallback_on", PLATFORM, ORG, REPO_L, locks=locks_at(PLATFORM, "fallback_on")),
        "fallback_on",
        frozenset({Condition.OVERLOADED}),
        PLATFORM,
    ),
    Case(
        "team lock on hops without a value: org answers",
        setters("max_fallback_hops", ORG, BINDING, locks=locks_at(TEAM, "max_fallback_hops")),
        "max_fallback_hops",
        1,
        ORG,
    ),
    Case("no policy: no headroom floor", {}, "min_headroom_percent", 0, DEFAULT),
    Case(
        "team lock on the headroom floor vetoes the repo's",
        setters("min_headroom_percent", TEAM, REPO_L, locks=locks_at(TEAM, "min_headroom_percent")),
        "min_headroom_percent",
        25,
        TEAM,
    ),
    Case(
        "a repo may switch the floor off with 0",
        {TEAM: {"min_headroom_percent": 20}, REPO_L: {"min_headroom_percent": 0}},
        "min_headroom_percent",
        0,
        REPO_L,
    ),
    # tenancy: team and org apply through the store's own listings only
    Case("a repo outside the team gets no team value", {TEAM: {F: ["x"]}, "repo:other/repo": {}}, F, None, DEFAULT),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fold(case: Case) -> None:
    repo = "other/repo" if "outside the team" in case.name else REPO
    resolved = fold(case.docs, repo=repo)
    assert getattr(resolved, case.field) == case.value
    assert resolved.provenance[case.field] == case.provenance
    assert resolved.revision == 7
    assert set(PolicyField) <= set(resolved.provenance)


def test_lock_reports_vetoed_setters_and_the_locking_level() -> None:
    resolved = fold(setters(F, PLATFORM, ORG, TEAM, REPO_L, BINDING, locks=locks_at(TEAM, F)))
    assert resolved.locked_by == {F: TEAM}
    assert resolved.vetoed == {F: (REPO_L, BINDING)}


def test_binding_level_needs_a_role() -> None:
    docs = setters(F, REPO_L, BINDING)
    assert fold(docs, role=None).account_order == (f"acct-{REPO_L}",)
    assert fold(docs, role="implementer").provenance[F] == REPO_L


class CeilingCase(NamedTuple):
    name: str
    doc: dict[str, Any]
    ceiling: Ceiling
    fallback_on: frozenset[Condition]
    hops: int
    ceilinged: tuple[str, ...]


NARROW = Ceiling(fallback_on=frozenset({Condition.RATE_LIMITED, Condition.OVERLOADED}), max_fallback_hops=1)
CEILING_CASES = [
    CeilingCase("nothing set: the ceiling itself", {}, NARROW, NARROW.fallback_on, 1, ()),
    CeilingCase(
        "a subset passes unchanged",
        {"fallback_on": ["rate-limited"]},
        NARROW,
        frozenset({Condition.RATE_LIMITED}),
        1,
        (),
    ),
    CeilingCase(
        "the ceiling prunes",
        {"fallback_on": ["rate-limited", "upstream-unavailable"]},
        NARROW,
        frozenset({Condition.RATE_LIMITED}),
        1,
        ("fallback_on",),
    ),
    CeilingCase("the ceiling never extends: empty stays empty", {"fallback_on": []}, NARROW, frozenset(), 1, ()),
    CeilingCase(
        "disjoint prunes to nothing", {"fallback_on": ["transport-error"]}, NARROW, frozenset(), 1, ("fallback_on",)
    ),
    CeilingCase("hops capped", {"max_fallback_hops": 5}, NARROW, NARROW.fallback_on, 1, ("max_fallback_hops",)),
    CeilingCase("hops lowered", {"max_fallback_hops": 0}, NARROW, NARROW.fallback_on, 0, ()),
    CeilingCase(
        "zero-hop ceiling caps everything",
        {"max_fallback_hops": 3},
        Ceiling(fallback_on=ALL, max_fallback_hops=0),
        ALL,
        0,
        ("max_fallback_hops",),
    ),
]


@pytest.mark.parametrize("case", CEILING_CASES, ids=[c.name for c in CEILING_CASES])
@pytest.mark.parametrize("label", [PLATFORM, TEAM, BINDING])
def test_ceilings_prune_and_never_extend(case: CeilingCase, label: str) -> None:
    resolved = fold({label: case.doc}, ceiling=case.ceiling)
    assert resolved.fallback_on == case.fallback_on
    assert resolved.fallback_on <= case.ceiling.fallback_on
    assert resolved.max_fallback_hops == case.hops
    assert resolved.ceilinged == case.ceilinged
    if "fallback_on" in case.doc:
        assert resolved.provenance["fallback_on"] == label


def test_model_classes_fold_entry_wise() -> None:
    docs = {
        PLATFORM: {"model_classes": {"top": {"anthropic": "claude-opus-4", "zai-harness": "glm-4.6"}}},
        TEAM: {"model_classes": {"top": {"anthropic": "claude-sonnet-4-6"}, "fast": {"anthropic": "claude-haiku-4"}}},
        BINDING: {"model_classes": {"fast": {"openai": "gpt-5-mini"}}},
    }
    resolved = fold(docs)
    assert resolved.model_classes == {
        "top": {"anthropic": "claude-sonnet-4-6", "zai-harness": "glm-4.6"},
        "fast": {"anthropic": "claude-haiku-4", "openai": "gpt-5-mini"},
    }
    assert resolved.provenance["model_classes.top.anthropic"] == TEAM
    assert resolved.provenance["model_classes.top.zai-harness"] == PLATFORM
    assert resolved.provenance["model_classes.fast.openai"] == BINDING
    assert resolved.provenance["model_classes"] == BINDING


def test_a_lock_binds_the_whole_model_class_block() -> None:
    docs = {
        PLATFORM: {"model_classes": {"top": {"anthropic": "claude-opus-4"}}},
        TEAM: {"model_classes": {"top": {"zai-harness": "glm-4.6"}}, "locks": ["model_classes"]},
        REPO_L: {"model_classes": {"top": {"anthropic": "claude-haiku-4"}, "fast": {"openai": "gpt-5-mini"}}},
    }
    resolved = fold(docs)
    assert resolved.model_classes == {"top": {"anthropic": "claude-opus-4", "zai-harness": "glm-4.6"}}
    assert resolved.vetoed == {"model_classes": (REPO_L,)}
    assert resolved.provenance["model_classes"] == TEAM


def test_tenancy_comes_from_the_documents() -> None:
    state = state_of({TEAM: {F: ["from-team"]}, "team:infra": {"repos": ["acme/ops"], F: ["from-infra"]}})
    assert state.team_of == {REPO: "payments", "acme/ops": "infra"}
    assert state.org_of == {"payments": "acme"}
    assert resolve(state, "acme/ops", None, CEIL, 1).account_order == ("from-infra",)
    assert resolve(state, REPO, None, CEIL, 1).account_order == ("from-team",)


def test_a_later_record_replaces_the_level_whole() -> None:
    records = [
        {"seq": 1, "name": TEAM, "document": {"repos": [REPO], F: ["a"], "providers": ["openai"]}},
        {"seq": 2, "name": TEAM, "document": {"repos": [REPO], F: ["b"]}},
    ]
    state = fold_records(records)
    assert state.written_at == {TEAM: 2}
    resolved = resolve(state, REPO, None, CEIL, 2)
    assert resolved.account_order == ("b",) and resolved.providers is None


def test_an_undecodable_record_is_never_believed() -> None:
    state = fold_records(
        [
            {"seq": 1, "name": "platform", "document": {"account_order": "not-a-list"}},
            {"seq": 2, "name": "nowhere", "document": {}},
        ]
    )
    assert state.unreadable == (1, 2)


def test_documents_round_trip_without_defaults() -> None:
    doc = msgspec.convert({"account_order": ["a"], "locks": []}, LevelDocument)
    assert msgspec.json.decode(msgspec.json.encode(doc)) == {"account_order": ["a"]}
