"""Policy level documents (SPEC §10): the levels' names, the fields a document may set, and the
check a write passes before the store appends it (`check_document`, its `Finding`s).

Pure. A document is parsed strictly (unknown fields, malformed names and out-of-bound lists are
refused, each `Problem` naming what it refused); `core.policy` folds the documents that passed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Annotated, Any

import msgspec

from controlplane.core.budgets import (
    WINDOWS,
    BudgetEntry,
    EntryProblems,
    entry_problems,
)
from shared.codes import Binding, Condition


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
    MIN_HEADROOM_PERCENT = "min_headroom_percent"


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


TENANT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
REPO_SLUG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,255}$")
ROLE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
CLASS_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

# Bounds on one document (a chain record must stay far below the chain's 64 KiB tail read).
MAX_LIST = 256
Short = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
ShortList = Annotated[tuple[Short, ...], msgspec.Meta(max_length=MAX_LIST)]
Hops = Annotated[int, msgspec.Meta(ge=0, le=16)]
HeadroomPercent = Annotated[int, msgspec.Meta(ge=0, le=50)]
ModelClasses = Annotated[
    dict[Short, Annotated[dict[Short, Short], msgspec.Meta(max_length=8)]], msgspec.Meta(max_length=64)
]


class Level(msgspec.Struct, frozen=True, kw_only=True):
    kind: LevelKind
    tenant: str | None = None  # org_id, team_id or repo_slug
    worker_role: str | None = None  # binding levels only

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


class LevelDocument(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """One level's document, as stored. Strings are checked by `check_document`, not by type,
    so that a refusal can name every unknown value at once."""

    account_order: ShortList | None = None
    providers: ShortList | None = None
    fallback_on: ShortList | None = None
    max_fallback_hops: Hops | None = None
    model_classes: ModelClasses | None = None
    min_headroom_percent: HeadroomPercent | None = None
    locks: ShortList = ()
    teams: ShortList | None = None  # org documents only
    repos: ShortList | None = None  # team documents only
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
    document: LevelDocument | None  # None when any finding was made
    findings: tuple[Finding, ...] = ()


def allowed_fields(kind: LevelKind) -> frozenset[str]:
    fields = {str(f) for f in PolicyField} | {"locks", "budgets"}
    if kind in TENANCY_FIELD:
        fields.add(TENANCY_FIELD[kind])
    return frozenset(fields)


def check_document(level: Level, raw: Any, known_accounts: Iterable[str]) -> Checked:
    """Validate one document for `level`; every finding names what it refuses."""
    if not isinstance(raw, dict):
        return Checked(
            document=None,
            findings=(
                Finding(field="document", problem=Problem.INVALID_VALUE, detail="the document must be a JSON object"),
            ),
        )
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
    return (
        [Finding(field=field, problem=Problem.INVALID_VALUE, names=bad, detail=f"must match {pattern.pattern}")]
        if bad
        else []
    )


def _value_findings(doc: LevelDocument, accounts: frozenset[str]) -> list[Finding]:
    bindings = [str(b) for b in Binding]
    found: list[Finding] = []
    found += _unknown("account_order", Problem.UNKNOWN_ACCOUNT, doc.account_order or (), accounts)
    found += _unknown("providers", Problem.UNKNOWN_BINDING, doc.providers or (), bindings)
    found += _unknown("fallback_on", Problem.UNKNOWN_CONDITION, doc.fallback_on or (), [str(c) for c in Condition])
    found += _unknown("locks", Problem.UNKNOWN_LOCK, doc.locks, [str(f) for f in PolicyField])
    classes = doc.model_classes or {}
    found += _malformed("model_classes", classes, CLASS_RE)
    found += _unknown(
        "model_classes", Problem.UNKNOWN_BINDING, [b for by_binding in classes.values() for b in by_binding], bindings
    )
    found += _malformed("teams", doc.teams or (), TENANT_ID_RE)
    found += _malformed("repos", doc.repos or (), REPO_SLUG_RE)
    for name in ("account_order", "providers", "fallback_on", "locks", "teams", "repos"):
        found += _duplicates(name, getattr(doc, name))
    return found + _budget_findings(entry_problems(doc.budgets or ()))


def _budget_findings(found: EntryProblems) -> list[Finding]:
    checks = (
        (found.unknown_windows, Problem.INVALID_VALUE, "window must be " + " | ".join(WINDOWS)),
        (found.bad_usd, Problem.INVALID_VALUE, "usd must be a number above 0"),
        (found.duplicates, Problem.DUPLICATE_ENTRY, "at most one budget per window"),
    )
    return [
        Finding(field="budgets", problem=problem, names=names, detail=detail)
        for names, problem, detail in checks
        if names
    ]
