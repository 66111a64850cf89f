"""The lines of `lease-decisions.jsonl` and what a compaction keeps of them (SPEC §5): pure.

Three kinds of line, one a line: a `Decision` (as it always was: a mint's, a renewal's or a hop's,
ids, lineage and position, nothing secret), an `Ended` mark (its key ended at `at_ms`) and an
`Evidence` mark (one terminal row's condition for a decision, embedded mode only: fleet mode's
evidence is Redis's). A decision is kept while its key is live, and for `ENDED_KEPT_MS` after its
key ended, so a retry citing a lease released within the hour finds the cited decision, its
lineage and its evidence after a restart exactly as before it; then it is compacted away.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

import msgspec

from controlplane.decisions import Decision
from shared.codes import Condition

ENDED_KEPT_MS = 3_600_000  # SPEC §5: "leases ended within the last hour"


class Ended(msgspec.Struct, frozen=True, kw_only=True, tag="ended", tag_field="mark"):
    key_id: str
    at_ms: int


class Evidence(msgspec.Struct, frozen=True, kw_only=True, tag="evidence", tag_field="mark"):
    mint_decision_id: str
    condition: Condition | None = None


Line = Decision | Ended | Evidence

encode_line = msgspec.json.Encoder().encode
_decode_decision = msgspec.json.Decoder(Decision).decode
_decode_mark = msgspec.json.Decoder(Ended | Evidence).decode


def decode_line(line: bytes) -> Line:
    """A journal line, strictly: a decision (no `mark`), or a mark. Anything else raises
    `msgspec.DecodeError` (the replay skips and counts it)."""
    try:
        return _decode_decision(line)
    except msgspec.ValidationError:  # well-formed JSON, not a decision: a mark, or hostile
        return _decode_mark(line)


def kept_after_end(ended_at_ms: int, now_ms: int) -> bool:
    """Is a decision whose key ended at `ended_at_ms` still kept at `now_ms`? (Under an hour; a
    clock that stepped back keeps it, the safe direction.)"""
    return now_ms - ended_at_ms < ENDED_KEPT_MS


class Kept(msgspec.Struct, frozen=True, kw_only=True):
    """What a compaction keeps: the decisions (in the order they were recorded), the ends of the
    keys that ended within the hour, and the kept decisions' evidence (in arrival order)."""

    decisions: tuple[Decision, ...]
    ended: dict[str, int]
    evidence: dict[str, tuple[Condition | None, ...]]


def retain(
    decisions: Iterable[Decision],
    ended: Mapping[str, int],
    evidence: Mapping[str, Sequence[Condition | None]],
    live: Collection[str],
    now_ms: int,
) -> Kept:
    """Of the journal's `decisions`, the ones whose key is `live` (every decision of a live key:
    its grant's and its hops') or `ended` under an hour ago. A decision whose key is neither (a
    record whose grant never happened, a key ended over an hour ago) is dropped, and so is its
    evidence; the evidence kept is each condition once (`_distinct`)."""
    ends = {key: at for key, at in ended.items() if key not in live and kept_after_end(at, now_ms)}
    kept = tuple(d for d in decisions if d.key_id is not None and (d.key_id in live or d.key_id in ends))
    ids = {d.mint_decision_id for d in kept}
    keys = {d.key_id for d in kept}
    return Kept(
        decisions=kept,
        ended={key: at for key, at in ends.items() if key in keys},
        evidence={i: _distinct(c) for i, c in evidence.items() if i in ids and c},
    )


def _distinct(conditions: Sequence[Condition | None]) -> tuple[Condition | None, ...]:
    """A decision's evidence as a citation's verdict reads it (`authorise_fallback`: is there
    any, and does any qualify): each condition once, in the order it first arrived."""
    return tuple(dict.fromkeys(conditions))


def lines_of(kept: Kept) -> list[Line]:
    """The compacted journal, in an order a replay reads back the same."""
    lines: list[Line] = list(kept.decisions)
    lines.extend(Ended(key_id=key, at_ms=at) for key, at in kept.ended.items())
    for decision_id, conditions in kept.evidence.items():
        lines.extend(Evidence(mint_decision_id=decision_id, condition=c) for c in conditions)
    return lines
