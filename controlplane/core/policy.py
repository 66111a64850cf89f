"""Routing policy (SPEC §10, seed 003 §0 and its lock doctrine): level documents and the fold.

Pure. A level is named `platform`, `org:<org_id>`, `team:<team_id>`, `repo:<repo_slug>` or
`binding:<repo_slug>#<worker_role>`, least to most specific. Each holds one document; org
documents list their `teams`, team documents their `repos` — the tenancy lives here, so the
mint names only a repo and a role, never an org or a team.

The fold is per field: the most specific level that sets a field wins, unless a less specific
level listed the field in its `locks`. A lock vetoes every MORE specific setter and answers
at-or-below itself: the value is the most specific setter between the platform and the least
specific locking level (a lock on a level that does not set the field lets a less specific
level's value stand, with that level's provenance). `account_order` and `providers` replace
wholesale; `model_classes` folds entry-wise per class × binding (a lock binds the whole block);
`fallback_on` is intersected with the platform ceiling (which prunes, never extends) and
`max_fallback_hops` is capped by it. `budgets` (SPEC §18) is neither folded nor lockable: every
level of the chain that sets one applies to its own scope (`core.budgets`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Annotated, Any

import msgspec

from controlplane.core.budgets import (
    WINDOWS, BudgetEntry, EntryProblems, LevelBudget, budgets_of, entry_problems,
)
from shared.codes import Binding, Condition


class ResolvedPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """The fold of every level for one (repo, role): what the mint obeys."""

    revision: int = 0
    account_order: tuple[str, ...] | None = None
    providers: tuple[str, ...] | None = None
    fallback_on: frozenset[Condition] = frozenset(Condition)
    max_fallback_hops: int = 1
    model_classes: dict[str, dict[str, str]] = {}
    provenance: dict[str, str] = {}                 # field (or model_classes.<class>.<binding>) → level label
    locked_by: dict[str, str] = {}                  # field → the least specific level that locked it
    vetoed: dict[str, tuple[str, ...]] = {}         # field → more specific setters a lock overruled
    ceilinged: tuple[str, ...] = ()                 # fields whose chosen value the platform ceiling cut
    budgets: tuple[LevelBudget, ...] = ()           # every budget on the chain, each for its own level (§18)


class LevelKind(StrEnum):
    """Least to most specific, in declaration order."""

    PLATFORM = "platform"
    ORG = "org"
    TEAM = "team"
    REPO = "repo"
    BINDING = "binding"


class PolicyField(StrEnum):
    """The fields a level may set, and so the only names a `locks` list may hold."""

    ACCOUNT_ORDER = "account_order"
    PROVIDERS = "providers"
    FALLBACK_ON = "fallback_on"
    MAX_FALLBACK_HOPS = "max_fallback_hops"
    MODEL_CLASSES = "model_classes"


class Problem(StrEnum):
    """Why a write was refused (422), each naming what it refused."""

    INVALID_LEVEL = "invalid-level"
    INVALID_VALUE = "invalid-value"
    UNKNOWN_FIELD = "unknown-field"
    UNKNOWN_ACCOUNT = "unknown-account"
    UNKNOWN_BINDING = "unknown-binding"
    UNKNOWN_CONDITION = "unknown-condition"
    UNKNOWN_LOCK = "unknown-lock"
    DUPLICATE_ENTRY = "duplicate-entry"
    TENANCY_CONFLICT = "tenancy-conflict"


DEFAULT = "default"   # provenance of a field no level sets (no ceiling involved)
CEILING = "ceiling"   # provenance of a ceilinged field no level sets: the platform ceiling itself

TENANT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
REPO_SLUG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,255}$")
ROLE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
CLASS_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

# Bounds on one document (a chain record must stay far below the chain's 64 KiB tail read).
MAX_LIST = 256
Short = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
ShortList = Annotated[tuple[Short, ...], msgspec.Meta(max_length=MAX_LIST)]
Hops = Annotated[int, msgspec.Meta(ge=0, le=16)]
ModelClasses = Annotated[dict[Short, Annotated[dict[Short, Short], msgspec.Meta(max_length=8)]],
                         msgspec.Meta(max_length=64)]


class Level(msgspec.Struct, frozen=True, kw_only=True):
    kind: LevelKind
    tenant: str | None = None        # org_id, team_id or repo_slug
    worker_role: str | None = None   # binding levels only

    @property
    def label(self) -> str:
        if self.kind == LevelKind.PLATFORM:
            return "platform"
        if self.kind == LevelKind.BINDING:
            return f"binding:{self.tenant}#{self.worker_role}"
        return f"{self.kind}:{self.tenant}"


def parse_level(name: str) -> Level | None:
    """The level a name spells, or None when it spells none."""
    if name == "platform":
        return Level(kind=LevelKind.PLATFORM)
    kind, sep, rest = name.partition(":")
    if not sep:
        return None
    if kind in (LevelKind.ORG, LevelKind.TEAM) and TENANT_ID_RE.match(rest):
        return Level(kind=LevelKind(kind), tenant=rest)
    if kind == LevelKind.REPO and REPO_SLUG_RE.match(rest):
        return Level(kind=LevelKind.REPO, tenant=rest)
    if kind == LevelKind.BINDING:
        repo, hash_, role = rest.partition("#")
        if hash_ and REPO_SLUG_RE.match(repo) and ROLE_RE.match(role):
            return Level(kind=LevelKind.BINDING, tenant=repo, worker_role=role)
    return None


class LevelDocument(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True,
                    omit_defaults=True):
    """One level's document, as stored. Strings are checked by `check_document`, not by type,
    so that a refusal can name every unknown value at once."""

    account_order: ShortList | None = None
    providers: ShortList | None = None
    fallback_on: ShortList | None = None
    max_fallback_hops: Hops | None = None
    model_classes: ModelClasses | None = None
    locks: ShortList = ()
    teams: ShortList | None = None   # org documents only
    repos: ShortList | None = None   # team documents only
    budgets: Annotated[tuple[BudgetEntry, ...], msgspec.Meta(max_length=MAX_LIST)] | None = None

    def sets(self, field: PolicyField) -> bool:
        return getattr(self, str(field)) is not None


TENANCY_FIELD: dict[LevelKind, str] = {LevelKind.ORG: "teams", LevelKind.TEAM: "repos"}


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    field: str
    problem: Problem
    names: tuple[str, ...] = ()
    detail: str = ""


class Checked(msgspec.Struct, frozen=True, kw_only=True):
    document: LevelDocument | None     # None when any finding was made
    findings: tuple[Finding, ...] = ()


def allowed_fields(kind: LevelKind) -> frozenset[str]:
    fields = {str(f) for f in PolicyField} | {"locks", "budgets"}
    if kind in TENANCY_FIELD:
        fields.add(TENANCY_FIELD[kind])
    return frozenset(fields)


def check_document(level: Level, raw: Any, known_accounts: Iterable[str]) -> Checked:
    """Validate one document for `level`; every finding names what it refuses."""
    if not isinstance(raw, dict):
        return Checked(document=None, findings=(Finding(field="document", problem=Problem.INVALID_VALUE,
                                                        detail="the document must be a JSON object"),))
    allowed = allowed_fields(level.kind)
    findings: list[Finding] = []
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        findings.append(Finding(field="document", problem=Problem.UNKNOWN_FIELD, names=tuple(unknown)))
    try:
        document = msgspec.convert({k: v for k, v in raw.items() if k in allowed}, LevelDocument)
    except msgspec.ValidationError as exc:
        findings.append(Finding(field="document", problem=Problem.INVALID_VALUE, detail=str(exc)))
        return Checked(document=None, findings=tuple(findings))
    findings += _value_findings(document, frozenset(known_accounts))
    return Checked(document=None if findings else document, findings=tuple(findings))


def _unknown(field: str, problem: Problem, values: Iterable[str], known: Iterable[str]) -> list[Finding]:
    vocabulary = set(known)
    names = tuple(dict.fromkeys(v for v in values if v not in vocabulary))
    return [Finding(field=field, problem=problem, names=names)] if names else []


def _duplicates(field: str, values: Sequence[str] | None) -> list[Finding]:
    if values is None:
        return []
    seen: set[str] = set()
    dups = tuple(dict.fromkeys(v for v in values if v in seen or seen.add(v)))  # type: ignore[func-returns-value]
    return [Finding(field=field, problem=Problem.DUPLICATE_ENTRY, names=dups)] if dups else []


def _malformed(field: str, values: Iterable[str], pattern: re.Pattern[str]) -> list[Finding]:
    bad = tuple(v for v in values if not pattern.match(v))
    return [Finding(field=field, problem=Problem.INVALID_VALUE, names=bad,
                    detail=f"must match {pattern.pattern}")] if bad else []


def _value_findings(doc: LevelDocument, accounts: frozenset[str]) -> list[Finding]:
    bindings = [str(b) for b in Binding]
    found: list[Finding] = []
    found += _unknown("account_order", Problem.UNKNOWN_ACCOUNT, doc.account_order or (), accounts)
    found += _unknown("providers", Problem.UNKNOWN_BINDING, doc.providers or (), bindings)
    found += _unknown("fallback_on", Problem.UNKNOWN_CONDITION, doc.fallback_on or (), [str(c) for c in Condition])
    found += _unknown("locks", Problem.UNKNOWN_LOCK, doc.locks, [str(f) for f in PolicyField])
    classes = doc.model_classes or {}
    found += _malformed("model_classes", classes, CLASS_RE)
    found += _unknown("model_classes", Problem.UNKNOWN_BINDING,
                      [b for by_binding in classes.values() for b in by_binding], bindings)
    found += _malformed("teams", doc.teams or (), TENANT_ID_RE)
    found += _malformed("repos", doc.repos or (), REPO_SLUG_RE)
    for name in ("account_order", "providers", "fallback_on", "locks", "teams", "repos"):
        found += _duplicates(name, getattr(doc, name))
    return found + _budget_findings(entry_problems(doc.budgets or ()))


def _budget_findings(found: EntryProblems) -> list[Finding]:
    checks = ((found.unknown_windows, Problem.INVALID_VALUE, "window must be " + " | ".join(WINDOWS)),
              (found.bad_usd, Problem.INVALID_VALUE, "usd must be a number above 0"),
              (found.duplicates, Problem.DUPLICATE_ENTRY, "at most one budget per window"))
    return [Finding(field="budgets", problem=problem, names=names, detail=detail)
            for names, problem, detail in checks if names]


# ---- the store's state: every level's current document and the tenancy it declares ---------

class PolicyState(msgspec.Struct, frozen=True, kw_only=True):
    documents: dict[str, LevelDocument] = {}   # by level label
    written_at: dict[str, int] = {}            # label → seq of the record that wrote it
    team_of: dict[str, str] = {}               # repo_slug → team_id
    org_of: dict[str, str] = {}                # team_id → org_id
    unreadable: tuple[int, ...] = ()           # seqs whose document does not decode (never believed)


def fold_records(records: Sequence[Mapping[str, Any]]) -> PolicyState:
    """The current document of every level: each record replaces its level's document whole."""
    documents: dict[str, LevelDocument] = {}
    written_at: dict[str, int] = {}
    unreadable: list[int] = []
    for record in records:
        if record.get("action") == "seal":  # fleet mode's adoption record (SPEC §19): no document
            continue
        level = parse_level(str(record.get("name", "")))
        try:
            document = msgspec.convert(record.get("document"), LevelDocument)
        except msgspec.ValidationError:
            document = None
        if level is None or document is None:
            unreadable.append(int(record.get("seq", 0)))
            continue
        documents[level.label] = document
        written_at[level.label] = int(record.get("seq", 0))
    return PolicyState(documents=documents, written_at=written_at, unreadable=tuple(unreadable),
                       team_of=_owners(documents, LevelKind.TEAM), org_of=_owners(documents, LevelKind.ORG))


def _owners(documents: Mapping[str, LevelDocument], kind: LevelKind) -> dict[str, str]:
    """member → owner for one tenancy field; on a (write-refused) double listing the first
    owner in label order keeps the member, so the answer is deterministic."""
    owners: dict[str, str] = {}
    for label in sorted(documents):
        level = parse_level(label)
        if level is None or level.kind != kind:
            continue
        for member in getattr(documents[label], TENANCY_FIELD[kind]) or ():
            owners.setdefault(member, str(level.tenant))
    return owners


def tenancy_conflicts(state: PolicyState, level: Level, document: LevelDocument) -> tuple[Finding, ...]:
    """A repo belongs to at most one team, a team to at most one org: refuse a second claim."""
    if level.kind not in TENANCY_FIELD:
        return ()
    field = TENANCY_FIELD[level.kind]
    owners = state.team_of if level.kind == LevelKind.TEAM else state.org_of
    taken = tuple(m for m in getattr(document, field) or () if owners.get(m, level.tenant) != level.tenant)
    if not taken:
        return ()
    holders = sorted({f"{level.kind}:{owners[m]}" for m in taken})
    return (Finding(field=field, problem=Problem.TENANCY_CONFLICT, names=taken,
                    detail="already listed by " + ", ".join(holders)),)


# ---- the fold ----------------------------------------------------------------------------

class Layer(msgspec.Struct, frozen=True):
    label: str
    document: LevelDocument


class Ceiling(msgspec.Struct, frozen=True, kw_only=True):
    """The platform ceilings of SPEC §2 (`GATEWAY_FALLBACK_ON`, `GATEWAY_MAX_FALLBACK_HOPS`)."""

    fallback_on: frozenset[Condition]
    max_fallback_hops: int


class Tenancy(msgspec.Struct, frozen=True, kw_only=True):
    team: str | None
    org: str | None
    labels: tuple[str, ...]     # every level consulted, least → most specific (present or not)


def tenancy_of(state: PolicyState, repo_slug: str, worker_role: str | None) -> Tenancy:
    team = state.team_of.get(repo_slug)
    org = state.org_of.get(team) if team is not None else None
    labels = ["platform"]
    if org is not None:
        labels.append(f"org:{org}")
    if team is not None:
        labels.append(f"team:{team}")
    labels.append(f"repo:{repo_slug}")
    if worker_role is not None:
        labels.append(f"binding:{repo_slug}#{worker_role}")
    return Tenancy(team=team, org=org, labels=tuple(labels))


def layers_for(state: PolicyState, repo_slug: str, worker_role: str | None) -> tuple[Layer, ...]:
    """The documents that apply to one (repo, role), least → most specific; absent levels left out."""
    labels = tenancy_of(state, repo_slug, worker_role).labels
    return tuple(Layer(label, state.documents[label]) for label in labels if label in state.documents)


class _Decided(msgspec.Struct, frozen=True):
    eligible: tuple[Layer, ...]    # the levels allowed to answer, least → most specific
    winner: Layer | None           # the most specific eligible setter
    locked_by: str | None
    vetoed: tuple[str, ...]        # more specific setters a lock overruled


def _decide(layers: Sequence[Layer], field: PolicyField) -> _Decided:
    bound = next((i for i, layer in enumerate(layers) if str(field) in layer.document.locks), None)
    eligible = tuple(layers if bound is None else layers[:bound + 1])
    winner = next((layer for layer in reversed(eligible) if layer.document.sets(field)), None)
    vetoed = tuple(layer.label for layer in layers[len(eligible):] if layer.document.sets(field))
    return _Decided(eligible, winner, None if bound is None else layers[bound].label, vetoed)


def fold_policy(layers: Sequence[Layer], ceiling: Ceiling, revision: int) -> ResolvedPolicy:
    decided = {field: _decide(layers, field) for field in PolicyField}
    provenance = {str(f): d.winner.label if d.winner is not None else DEFAULT for f, d in decided.items()}
    locked_by = {str(f): d.locked_by for f, d in decided.items() if d.locked_by is not None}
    vetoed = {str(f): d.vetoed for f, d in decided.items() if d.vetoed}

    def value(field: PolicyField) -> Any:
        winner = decided[field].winner
        return None if winner is None else getattr(winner.document, str(field))

    fallback_on, hops, ceilinged = _under_ceiling(value(PolicyField.FALLBACK_ON),
                                                  value(PolicyField.MAX_FALLBACK_HOPS), ceiling)
    for field in (PolicyField.FALLBACK_ON, PolicyField.MAX_FALLBACK_HOPS):
        if value(field) is None:
            provenance[str(field)] = CEILING
    classes, cell_provenance = _fold_model_classes(decided[PolicyField.MODEL_CLASSES].eligible)
    provenance.update(cell_provenance)
    account_order, providers = value(PolicyField.ACCOUNT_ORDER), value(PolicyField.PROVIDERS)
    return ResolvedPolicy(
        revision=revision,
        account_order=None if account_order is None else tuple(account_order),
        providers=None if providers is None else tuple(providers),
        fallback_on=fallback_on, max_fallback_hops=hops, model_classes=classes,
        provenance=provenance, locked_by=locked_by, vetoed=vetoed, ceilinged=ceilinged,
        budgets=budgets_of((layer.label, layer.document.budgets) for layer in layers))


def _under_ceiling(chosen_on: Sequence[str] | None, chosen_hops: int | None,
                   ceiling: Ceiling) -> tuple[frozenset[Condition], int, tuple[str, ...]]:
    """The platform ceiling prunes `fallback_on` and caps the hops; it never extends either.
    Unset, each is the ceiling itself. Also names the fields whose chosen value it cut."""
    cut: list[str] = []
    fallback_on = ceiling.fallback_on
    if chosen_on is not None:
        chosen = frozenset(Condition(c) for c in chosen_on)
        fallback_on = chosen & ceiling.fallback_on
        if chosen - ceiling.fallback_on:
            cut.append(str(PolicyField.FALLBACK_ON))
    hops = ceiling.max_fallback_hops
    if chosen_hops is not None:
        hops = min(chosen_hops, ceiling.max_fallback_hops)
        if chosen_hops > ceiling.max_fallback_hops:
            cut.append(str(PolicyField.MAX_FALLBACK_HOPS))
    return fallback_on, hops, tuple(cut)


def _fold_model_classes(eligible: Sequence[Layer]) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """Entry-wise: each (class, binding) cell from the most specific eligible level setting it."""
    classes: dict[str, dict[str, str]] = {}
    provenance: dict[str, str] = {}
    for layer in eligible:
        for name, by_binding in (layer.document.model_classes or {}).items():
            for binding, model in by_binding.items():
                classes.setdefault(name, {})[binding] = model
                provenance[f"model_classes.{name}.{binding}"] = layer.label
    return classes, provenance


def resolve(state: PolicyState, repo_slug: str, worker_role: str | None, ceiling: Ceiling,
            revision: int) -> ResolvedPolicy:
    return fold_policy(layers_for(state, repo_slug, worker_role), ceiling, revision)
