"""This host's lease-bearing decisions, journalled (`lease-decisions.jsonl`): the decisions of its
live leases, and of its leases ended within the last hour, are what a control restart keeps in
both modes (SPEC §5), and the live ones are what fleet mode re-registers when Redis lost them
(SPEC §16). No Redis here: embedded mode imports it (tests/unit/test_lazy_imports.py). The line
format and what a compaction keeps are `controlplane/stores/decisionlines.py`'s (pure).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from controlplane.decisions import Decision, lease_decisions
from controlplane.stores.decisionlines import (
    Ended,
    Evidence,
    Kept,
    Line,
    decode_line,
    encode_line,
    kept_after_end,
    lines_of,
    retain,
)
from controlplane.stores.journal import replay
from shared.clock import now_ms
from shared.codes import Condition
from shared.logging import get_logger
from shared.private import create_private, open_append
from shared.wire import Lease

log = get_logger("control")

LEASE_DECISIONS_FILE = "lease-decisions.jsonl"
# The journal gains a line per selected decision (a mint, a renewal, a hop), per key end and per
# new condition of a decision's evidence (embedded), and is rewritten from memory at a key's end
# (off the mint's path: a mint writes its one line, as it always did) once its lines reach this or
# twice the lines it keeps, whichever is more. Every line but an end's adds to what is kept, and
# only an end lets go of any, so the journal stays within about max(4,096, 2 x kept) lines, kept
# being what the live leases and those ended within the hour need.
COMPACT_MIN_LINES = 4_096


class LeaseDecisions:
    """The decisions of this host's live leases and of its leases ended within the hour, kept by
    this host: what it re-registers when Redis lost them (SPEC §16), what its own renew, extend
    and hops read first, and (embedded) what a citation reads after a restart (SPEC §5).

    Each live key has its current decision (`of_key`): the one it was granted, then the one a
    hop re-bound it to; every decision of a live key stays findable by id (`get`). When a key
    ends (not when a hop lets go of its lease: the key stays and is re-bound) an `Ended` line
    is written, and its decisions (and their evidence: the distinct conditions of their terminal
    rows, all a citation's verdict reads) stay for `ENDED_KEPT_MS`; then memory lets them go
    (oldest end first, at the next end) and the next compaction drops them. Journalled,
    so they survive a control restart — also one while Redis lost its data:
    `$GATEWAY_STATE_DIR/lease-decisions.jsonl`, 0600, one line each (ids, lineage, position,
    conditions; nothing secret), appended without an fsync (as the key table's journal), and
    rewritten from memory at `load` and when it has grown past `COMPACT_MIN_LINES` and twice
    what it keeps. At load the key table says which leases are live and which decision each
    holds (`controlplane/decisions.lease_decisions`); a decision of a key neither live nor ended
    within the hour (a crash between a record and its grant) is dropped, and a line that does
    not decode is skipped and counted (`skipped`). A journal that cannot be written or read is
    logged and memory goes on.
    """

    def __init__(
        self, path: str | None, lease_of: Callable[[str], Lease | None], clock: Callable[[], int] = now_ms
    ) -> None:
        self.path = path
        self.lease_of = lease_of
        self.clock = clock
        self.skipped = 0  # journal lines that did not decode, since start
        self._by_key: dict[str, Decision] = {}  # live key -> its current decision
        self._by_id: dict[str, Decision] = {}  # every decision kept, in the order recorded
        self._ids_of_key: dict[str, list[str]] = {}  # key -> its decisions kept
        self._ended: dict[str, int] = {}  # key -> when it ended (kept under an hour)
        # the ends, oldest first: a deque, whose first is found in constant time however many
        # were let go before it (a dict's first is not: it skips the slots of every one deleted)
        self._end_order: deque[tuple[str, int]] = deque()
        self._evidence: dict[str, list[Condition | None]] = {}  # distinct, in arrival order
        self._evidence_lines = 0
        self._fd: int | None = None
        self._lines = 0
        self._loaded = False  # nothing is rewritten before `load` read what is there

    def load(self, leases: Sequence[Lease], ended: Mapping[str, int] | None = None) -> list[str]:
        """Replay the journal, keep the decisions of `leases` (the restored key table) and of
        the keys ended within the hour (the journal's ends, then `ended`: the leases the key
        table found expired at load, by expiry), rewrite it compacted; answers the keys of the
        v2 leases whose decision the journal lacked."""
        decisions: dict[str, Decision] = {}
        ends: dict[str, int] = {}
        evidence: dict[str, list[Condition | None]] = {}
        for line in self._replay():
            if isinstance(line, Decision):
                decisions[line.mint_decision_id] = line
            elif isinstance(line, Ended):
                ends[line.key_id] = line.at_ms
            else:
                evidence.setdefault(line.mint_decision_id, []).append(line.condition)
        for key_id, at_ms in (ended or {}).items():
            ends.setdefault(key_id, at_ms)
        current, missing = lease_decisions(leases, decisions)
        self._by_key = current
        self._adopt(retain(decisions.values(), ends, evidence, {lease.key_id for lease in leases}, self.clock()))
        self._loaded = True
        self._compact()
        log.info("lease_decisions_loaded", kept=len(self._by_id), live=len(current), skipped=self.skipped)
        return missing

    def add(self, decision: Decision) -> None:
        """A lease-bearing decision, recorded (a mint's, a renewal's or a hop's): one line."""
        assert decision.key_id is not None
        if self._loaded and self._fd is None:  # a write failed: rewritten, then reopened
            self._compact()  # before the new line: a crash before its grant finds the old one
        self._append(decision)
        self._by_key[decision.key_id] = decision
        self._ended.pop(decision.key_id, None)  # live (again): never let go while it is
        if decision.mint_decision_id not in self._by_id:
            self._ids_of_key.setdefault(decision.key_id, []).append(decision.mint_decision_id)
        self._by_id[decision.mint_decision_id] = decision

    def forget(self, key_id: str) -> None:
        """The key ended: its decisions are kept an hour from now. While the key is still live
        (a hop let go of its lease), nothing changes."""
        if self.lease_of(key_id) is not None or key_id not in self._by_key:
            return
        del self._by_key[key_id]
        at_ms = self.clock()
        self._ended[key_id] = at_ms
        self._end_order.append((key_id, at_ms))
        self._append(Ended(key_id=key_id, at_ms=at_ms))
        self._prune()
        if self._lines >= self._bound():
            self._compact()

    def add_evidence(self, mint_decision_id: str, condition: Condition | None) -> None:
        """One terminal row's condition for a kept decision (embedded mode: a citation after a
        restart reads it): a line when it is new for that decision; otherwise nothing."""
        if mint_decision_id not in self._by_id:
            return
        conditions = self._evidence.setdefault(mint_decision_id, [])
        if condition not in conditions:
            conditions.append(condition)
            self._evidence_lines += 1
            self._append(Evidence(mint_decision_id=mint_decision_id, condition=condition))

    def of_key(self, key_id: str) -> Decision | None:
        """A live key's current decision."""
        return self._by_key.get(key_id)

    def get(self, mint_decision_id: str) -> Decision | None:
        return self._by_id.get(mint_decision_id)

    def by_id(self) -> dict[str, Decision]:
        """Every decision kept, in the order recorded."""
        return dict(self._by_id)

    def current(self) -> dict[str, Decision]:
        """Each live key's current decision."""
        return dict(self._by_key)

    def evidence(self) -> dict[str, tuple[Condition | None, ...]]:
        return {decision_id: tuple(conditions) for decision_id, conditions in self._evidence.items()}

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _replay(self) -> list[Line]:
        if self.path is None:
            return []
        try:
            return list(replay(self.path, decode_line, "lease_decision_line_skipped", self._skip))
        except OSError as exc:  # unreadable: start with nothing rather than not start
            log.error("lease_decision_journal_read_failed", error=str(exc))
            return []

    def _skip(self) -> None:
        self.skipped += 1

    def _adopt(self, kept: Kept) -> None:
        self._by_id = {decision.mint_decision_id: decision for decision in kept.decisions}
        self._ids_of_key = {}
        for decision in kept.decisions:
            assert decision.key_id is not None  # `retain` keeps only lease-bearing decisions
            self._ids_of_key.setdefault(decision.key_id, []).append(decision.mint_decision_id)
        self._ended = dict(kept.ended)
        self._end_order = deque(sorted(kept.ended.items(), key=lambda item: item[1]))
        self._evidence = {decision_id: list(conditions) for decision_id, conditions in kept.evidence.items()}
        self._evidence_lines = sum(len(conditions) for conditions in kept.evidence.values())

    def _prune(self) -> None:
        """Let go of the decisions whose key ended an hour ago or more, oldest end first (each
        is let go once: amortised, a constant per end)."""
        now = self.clock()
        while self._end_order and not kept_after_end(self._end_order[0][1], now):
            key_id, at_ms = self._end_order.popleft()
            if self._ended.get(key_id) != at_ms:
                continue  # live again since (a fleet host's re-registration)
            del self._ended[key_id]
            for decision_id in self._ids_of_key.pop(key_id, ()):
                self._by_id.pop(decision_id, None)
                self._evidence_lines -= len(self._evidence.pop(decision_id, ()))

    def _bound(self) -> int:
        kept = len(self._by_id) + len(self._ended) + self._evidence_lines
        return max(COMPACT_MIN_LINES, 2 * kept)

    def _append(self, line: Line) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, encode_line(line) + b"\n")
            self._lines += 1
        except OSError as exc:
            log.error("lease_decision_journal_write_failed", error=str(exc))

    def _compact(self) -> None:
        """Rewrite the journal from what is kept (a temporary file, fsynced, then renamed over it)."""
        if self.path is None:
            return
        self.close()
        kept = retain(self._by_id.values(), self._ended, self._evidence, self._by_key.keys(), self.clock())
        self._adopt(kept)
        lines = lines_of(kept)
        tmp = self.path + ".tmp"
        try:
            with create_private(tmp) as handle:  # 0600 from its creation (SPEC §19)
                handle.write(b"".join(encode_line(line) + b"\n" for line in lines))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
            self._fd = open_append(self.path)
            self._lines = len(lines)
        except OSError as exc:  # tried again at the next add
            log.error("lease_decision_journal_write_failed", error=str(exc))
