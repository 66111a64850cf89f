"""Attempts in flight and the ring of recent terminal rows (SPEC §11, §14).

`active` holds every attempt the data plane has started and not finished; `recent` is a ring
of the last `RING_SIZE` terminal rows. Eviction is counted so a view can say `truncated`
rather than present a partial history as the whole of it.
"""

from __future__ import annotations

from collections import deque

import msgspec

from shared.wire import AttemptRow, ConnectionCounts, LoopReport

RING_SIZE = 200


def as_started(row: AttemptRow) -> AttemptRow:
    """A terminal row as its start was (what the data plane announces before the upstream
    answers): for the `route.started` event of an attempt reported once, by its finished row."""
    return msgspec.structs.replace(
        row,
        served_model=None,
        finished_at=None,
        status=None,
        http_status=None,
        condition=None,
        refusal_reason=None,
        usage=None,
        cost_usd=None,
        cost_reason=None,
        overhead_ms=None,
        retry_after_s=None,
        bytes_out=0,
        duration_ms=None,
        rate_limits=None,
        first_byte_ms=None,
    )


class RouteBook:
    def __init__(self, ring_size: int = RING_SIZE) -> None:
        self.active: dict[str, AttemptRow] = {}
        self.recent: deque[AttemptRow] = deque(maxlen=ring_size)
        self.evicted = 0
        self.sockets_open: dict[str, int] = {}  # per account, as the data plane last said (§20)
        self.connections = ConnectionCounts(refused=0, head_timeouts=0)  # the data plane's (§19)
        self.dataplane_loops: list[LoopReport] = []  # fleet mode: its Redis loops, as it last said (§19)

    def started(self, row: AttemptRow) -> None:
        self.active[row.attempt_id] = row

    def finished(self, row: AttemptRow) -> None:
        self.active.pop(row.attempt_id, None)
        if len(self.recent) == self.recent.maxlen:
            self.evicted += 1
        self.recent.append(row)

    def forget_active(self) -> list[AttemptRow]:
        """The data plane went away: its in-flight list is resent after the reconnect."""
        rows = list(self.active.values())
        self.active.clear()
        return rows

    def in_flight_by_account(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for row in self.active.values():
            counts[row.account_id] = counts.get(row.account_id, 0) + 1
        return counts

    def recent_view(self, limit: int) -> tuple[list[AttemptRow], bool, int, str | None]:
        """Newest first: `(rows, truncated, retained, evidence_since)`."""
        rows = list(reversed(self.recent))[:limit]
        retained = len(self.recent)
        truncated = self.evicted > 0 or retained > limit
        evidence_since = self.recent[0].started_at if self.recent else None
        return rows, truncated, retained, evidence_since


# ---- the read model: what a route view or a route event shows of a row ------------------


class RouteView(msgspec.Struct, frozen=True, kw_only=True):
    """One attempt as a read payload: the row without anything secret-shaped."""

    attempt_id: str
    key_id: str
    account_id: str
    mint_decision_id: str | None
    dispatch_id: str | None
    repo_slug: str
    principal_id: str
    wire: str
    path: str
    requested_model: str | None
    served_model: str | None
    stream: bool
    started_at: str
    finished_at: str | None
    status: str | None
    http_status: int | None
    condition: str | None
    refusal_reason: str | None
    usage: dict | None
    cost_usd: float | None
    cost_reason: str | None
    overhead_ms: float | None
    rate_limits: dict | None = None  # the provider's headroom the answer stated (SPEC §22)
    transport: str = "http"  # SPEC §14, §20: "http" | "websocket"
    hop: int = 0  # SPEC §8, §14
    first_byte_ms: float | None = None  # SPEC §14: sent upstream → first response byte


_VIEW_FIELDS = RouteView.__struct_fields__


def view_of(row: AttemptRow) -> dict:
    view = {name: getattr(row, name) for name in _VIEW_FIELDS}
    view["usage"] = msgspec.to_builtins(row.usage)
    if row.rate_limits is not None:
        view["rate_limits"] = msgspec.to_builtins(row.rate_limits)
    return view
