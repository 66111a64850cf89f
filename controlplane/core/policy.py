"""Routing policy (SPEC §10, seed 003 §0 and its lock doctrine): the fold of the level documents
(`core.policydocs` checks each one).

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

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from controlplane.core.budgets import LevelBudget, budgets_of
from controlplane.core.policydocs import (
    TENANCY_FIELD,
    Finding,
    Level,
    LevelDocument,
    LevelKind,
    PolicyField,
    Problem,
    parse_level,
)
from shared.codes import Condition


class ResolvedPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """The fold of every level for one (repo, role): what the mint obeys."""

    revision: int = 0
    account_order: tuple[str, ...] | None = None
    providers: tuple[str, ...] | None = None
    fallback_on: frozenset[Condition] = frozenset(Condition)
    max_fallback_hops: int = 1
    model_classes: dict[str, dict[str, str]] = {}
    provenance: dict[str, str] = {}  # field (or model_classes.<class>.<binding>) → level label
    locked_by: dict[str, str] = {}  # field → the least specific level that locked it
    vetoed: dict[str, tuple[str, ...]] = {}  # field → more specific setters a lock overruled
    ceilinged: tuple[str, ...] = ()  # fields whose chosen value the platform ceiling cut
    budgets: tuple[LevelBudget, ...] = ()  # every budget on the chain, each for its own level (§18)
    min_headroom_percent: int = 0  # 0 = off; else the rate-limit floor (§22)


DEFAULT = "default"  # provenance of a field no level sets (no ceiling involved)
CEILING = "ceiling"  # provenance of a ceilinged field no level sets: the platform ceiling itself

# ---- the store's state: every level's current document and the tenancy it declares ---------


class PolicyState(msgspec.Struct, frozen=True, kw_only=True):
    documents: dict[str, LevelDocument] = {}  # by level label
    written_at: dict[str, int] = {}  # label → seq of the record that wrote it
    team_of: dict[str, str] = {}  # repo_slug → team_id
    org_of: dict[str, str] = {}  # team_id → org_id
    unreadable: tuple[int, ...] = ()  # seqs whose document does not decode (never believed)


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
    return PolicyState(
        documents=documents,
        written_at=written_at,
        unreadable=tuple(unreadable),
        team_of=_owners(documents, LevelKind.TEAM),
        org_of=_owners(documents, LevelKind.ORG),
    )


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
    return (
        Finding(
            field=field, problem=Problem.TENANCY_CONFLICT, names=taken, detail="already listed by " + ", ".join(holders)
        ),
    )


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
    labels: tuple[str, ...]  # every level consulted, least → most specific (present or not)


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
    eligible: tuple[Layer, ...]  # the levels allowed to answer, least → most specific
    winner: Layer | None  # the most specific eligible setter
    locked_by: str | None
    vetoed: tuple[str, ...]  # more specific setters a lock overruled


def _decide(layers: Sequence[Layer], field: PolicyField) -> _Decided:
    bound = next((i for i, layer in enumerate(layers) if str(field) in layer.document.locks), None)
    eligible = tuple(layers if bound is None else layers[: bound + 1])
    winner = next((layer for layer in reversed(eligible) if layer.document.sets(field)), None)
    vetoed = tuple(layer.label for layer in layers[len(eligible) :] if layer.document.sets(field))
    return _Decided(eligible, winner, None if bound is None else layers[bound].label, vetoed)


def fold_policy(layers: Sequence[Layer], ceiling: Ceiling, revision: int) -> ResolvedPolicy:
    decided = {field: _decide(layers, field) for field in PolicyField}
    provenance = {str(f): d.winner.label if d.winner is not None else DEFAULT for f, d in decided.items()}
    locked_by = {str(f): d.locked_by for f, d in decided.items() if d.locked_by is not None}
    vetoed = {str(f): d.vetoed for f, d in decided.items() if d.vetoed}

    def value(field: PolicyField) -> Any:
        winner = decided[field].winner
        return None if winner is None else getattr(winner.document, str(field))

    fallback_on, hops, ceilinged = _under_ceiling(
        value(PolicyField.FALLBACK_ON), value(PolicyField.MAX_FALLBACK_HOPS), ceiling
    )
    for field in (PolicyField.FALLBACK_ON, PolicyField.MAX_FALLBACK_HOPS):
        if value(field) is None:
            provenance[str(field)] = CEILING
    classes, cell_provenance = _fold_model_classes(decided[PolicyField.MODEL_CLASSES].eligible)
    provenance.update(cell_provenance)
    account_order, providers = value(PolicyField.ACCOUNT_ORDER), value(PolicyField.PROVIDERS)
    floor = value(PolicyField.MIN_HEADROOM_PERCENT)
    return ResolvedPolicy(
        revision=revision,
        account_order=None if account_order is None else tuple(account_order),
        providers=None if providers is None else tuple(providers),
        fallback_on=fallback_on,
        max_fallback_hops=hops,
        model_classes=classes,
        provenance=provenance,
        locked_by=locked_by,
        vetoed=vetoed,
        ceilinged=ceilinged,
        min_headroom_percent=0 if floor is None else floor,
        budgets=budgets_of((layer.label, layer.document.budgets) for layer in layers),
    )


def _under_ceiling(
    chosen_on: Sequence[str] | None, chosen_hops: int | None, ceiling: Ceiling
) -> tuple[frozenset[Condition], int, tuple[str, ...]]:
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


def resolve(
    state: PolicyState, repo_slug: str, worker_role: str | None, ceiling: Ceiling, revision: int
) -> ResolvedPolicy:
    return fold_policy(layers_for(state, repo_slug, worker_role), ceiling, revision)
