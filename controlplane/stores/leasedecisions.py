"""This host's live leases' decisions, journalled (`lease-decisions.jsonl`): what a control
restart keeps in both modes (SPEC §5), and what fleet mode re-registers when Redis lost them
(SPEC §16). No Redis here: embedded mode imports it (tests/unit/test_lazy_imports.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import msgspec

from controlplane.decisions import Decision, lease_decisions
from controlplane.stores.journal import replay
from shared.logging import get_logger
from shared.private import create_private, open_append
from shared.wire import Lease

log = get_logger("control")

LEASE_DECISIONS_FILE = "lease-decisions.jsonl"
# The journal gains a line per selected decision (a mint, a renewal, a hop) and is rewritten from
# memory once its lines reach this or twice the live decisions, whichever is more: at a mint a
# second, about once an hour, and never past max(4,096, 2 x live) lines of ~400 bytes.
COMPACT_MIN_LINES = 4_096

_encode_line = msgspec.json.Encoder().encode
_decode_line = msgspec.json.Decoder(Decision).decode


class LeaseDecisions:
    """The decisions of this host's live leases, kept by this host: what it re-registers when
    Redis lost them (SPEC §16), and what its own renew, extend and hops read first.

    One decision per live key: the one it was granted, then the one a hop re-bound it to. Added
    when a lease-bearing decision is recorded, forgotten when its key ends (not when a hop lets
    go of the key's lease: the key stays and is re-bound). Journalled, so it survives a control
    restart — also one while Redis lost its data: `$GATEWAY_STATE_DIR/lease-decisions.jsonl`,
    one decision a line (ids, lineage, position; nothing secret), appended at each add without
    an fsync (as the key table's journal), and rewritten from memory at `load` and whenever it
    has grown past `COMPACT_MIN_LINES` and twice the live decisions. At load the key table says
    which decision each live lease holds (`controlplane/decisions.lease_decisions`); a journal line
    for a key it does not know (a crash between a record and its grant) is dropped. Only the
    decisions: their evidence is Redis's alone. A journal that cannot be written is logged and
    memory goes on (Redis has the decision; only a data loss and a restart together would lose it).
    """

    def __init__(self, path: str | None, lease_of: Callable[[str], Lease | None]) -> None:
        self.path = path
        self.lease_of = lease_of
        self._by_key: dict[str, Decision] = {}
        self._by_id: dict[str, Decision] = {}
        self._fd: int | None = None
        self._lines = 0
        self._loaded = False  # nothing is rewritten before `load` read what is there

    def load(self, leases: Sequence[Lease]) -> list[str]:
        """Replay the journal, keep the decisions `leases` (the restored key table) hold, rewrite
        it compacted; answers the keys of the v2 leases whose decision the journal lacked."""
        known: dict[str, Decision] = {}
        if self.path is not None:
            for decision in replay(self.path, _decode_line, "lease_decision_line_skipped"):
                known[decision.mint_decision_id] = decision
        kept, missing = lease_decisions(leases, known)
        self._by_key = {}
        self._by_id = {}
        for decision in kept.values():
            self._remember(decision)
        self._loaded = True
        self._compact()
        return missing

    def add(self, decision: Decision) -> None:
        """A lease-bearing decision, recorded (a mint's, a renewal's or a hop's)."""
        assert decision.key_id is not None
        if self._loaded and (self._fd is None or self._lines >= max(COMPACT_MIN_LINES, 2 * len(self._by_key))):
            self._compact()  # before the new line: a crash before its grant finds the old one
        self._append(decision)
        self._remember(decision)

    def forget(self, key_id: str) -> None:
        """The key ended; while it is still live (a hop let go of its lease), its decision stays."""
        if self.lease_of(key_id) is None:
            decision = self._by_key.pop(key_id, None)
            if decision is not None:
                self._by_id.pop(decision.mint_decision_id, None)

    def of_key(self, key_id: str) -> Decision | None:
        return self._by_key.get(key_id)

    def get(self, mint_decision_id: str) -> Decision | None:
        return self._by_id.get(mint_decision_id)

    def by_id(self) -> dict[str, Decision]:
        return dict(self._by_id)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _remember(self, decision: Decision) -> None:
        assert decision.key_id is not None
        previous = self._by_key.get(decision.key_id)
        if previous is not None:
            self._by_id.pop(previous.mint_decision_id, None)
        self._by_key[decision.key_id] = decision
        self._by_id[decision.mint_decision_id] = decision

    def _append(self, decision: Decision) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, _encode_line(decision) + b"\n")
            self._lines += 1
        except OSError as exc:
            log.error("lease_decision_journal_write_failed", error=str(exc))

    def _compact(self) -> None:
        """Rewrite the journal from memory (a temporary file, fsynced, then renamed over it)."""
        if self.path is None:
            return
        self.close()
        tmp = self.path + ".tmp"
        try:
            with create_private(tmp) as handle:  # 0600 from its creation (SPEC §19)
                for decision in self._by_key.values():
                    handle.write(_encode_line(decision) + b"\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
            self._fd = open_append(self.path)
            self._lines = len(self._by_key)
        except OSError as exc:  # tried again at the next add
            log.error("lease_decision_journal_write_failed", error=str(exc))
