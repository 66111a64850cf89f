"""`HeadroomBook`: each account's provider rate-limit headroom (SPEC §22), kept and published.

- **In**: a row listener (`on_row`) takes the `rate_limits` the data plane parsed from each
  upstream answer; fleet mode adds the other hosts' observations (`merge`, from
  `controlplane/fleet/headroom.py`). Per account and kind the newest observation wins; an
  account the registry does not know is ignored.
- **Out**: the accounts view's `rate_limits` (`view`), the two gauges
  (`leasehold_account_ratelimit_remaining` / `_limit{account_id,kind}`, `HeadroomGauges`:
  observations whose reset has not passed), what the mint asks (`low`, `lifts_at`: the floor is
  the resolved policy's, judged by `core.headroom`), and `headroom` events: when an account
  crosses below a floor the policy sets somewhere (`floors`: every distinct
  `min_headroom_percent` of every level) and when it recovers — by a newer observation, or by
  its reset passing (`tick`, each `TICK_S`).

Health stays evidence-based (`core.health`): headroom is its own fact, never evidence.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

import msgspec

from controlplane.core.headroom import (
    Observation,
    crossings,
    current,
    floors_of,
    headroom_percent,
    lifts_at,
    low_kinds,
    newer,
    observations_of,
)
from controlplane.events import EventHub, EventKind
from controlplane.upkeep import every, while_app_runs
from shared.clock import iso_ms, now_ms
from shared.logging import get_logger
from shared.wire import RATE_LIMIT_KINDS, AttemptRow, RateLimits

if TYPE_CHECKING:  # prometheus-client is imported at the first scrape (controlplane/metrics.py)
    from prometheus_client.core import Metric

log = get_logger("control")

ISO_MS_LEN = len("2026-12-01T00:00:00.000Z")  # `shared.clock.iso_ms`'s form
TICK_S = 0.5  # a skip lifts at its reset: the recovery event is at most this late

Observed = Callable[[str, str, Observation], None]  # (account, kind, observation) taken from a row


class KindView(msgspec.Struct, frozen=True, kw_only=True):
    """One kind of an account's headroom, as the accounts view shows it."""

    limit: int | None
    remaining: int
    reset_at: str | None
    observed_at: str
    headroom_percent: float | None  # remaining / limit, capped at 100
    current: bool  # judged now: a limit, and the reset still ahead


class HeadroomBook:
    def __init__(
        self,
        accounts: frozenset[str],
        events: EventHub | None = None,
        floors: Callable[[], tuple[int, ...]] = lambda: (),
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.accounts = accounts
        self.events = events
        self.floors = floors
        self.clock = clock
        self._held: dict[str, dict[str, Observation]] = {}
        self._pending: dict[str, RateLimits] = {}  # account → the newest row's, not yet folded
        self.observed_listeners: list[Observed] = []
        self.on_pending: Callable[[], None] | None = None  # fleet: wakes the publisher
        self._below: dict[str, frozenset[int]] = {}  # account → floors it is below now
        self._floors: tuple[int, ...] = ()  # the policy's, as last read (`refresh_floors`)

    # ---- in -------------------------------------------------------------------------------------

    def on_row(self, row: AttemptRow) -> None:
        """A row listener: the answer's observations, newest wins.

        Folded lazily: the row's `rate_limits` waits as the account's pending one until someone
        reads the book (`held`, `low`, `view`, the gauges, `tick`, the fleet's publish), and a
        newer row that restates every kind it stated replaces it unread. Only while a policy sets
        a floor is each row folded at once, so a crossing's event is not late. Reading five times
        and building four observations per row was half of control's cost per row."""
        stated = row.rate_limits
        if stated is None:
            return
        account_id = row.account_id
        if account_id not in self.accounts:
            return
        pending = self._pending.get(account_id)
        if pending is not None and not supersedes(stated, pending):
            self._fold_one(account_id, pending)
        self._pending[account_id] = stated
        if self.on_pending is not None:
            self.on_pending()
        if self._floors:
            self.check(account_id, self.clock(), self._floors)  # folds the account first

    @property
    def held(self) -> dict[str, dict[str, Observation]]:
        """account → kind → its newest observation (every pending row folded first)."""
        self.fold()
        return self._held

    def fold(self, account_id: str | None = None) -> None:
        """Fold the pending rows' observations in: one account's, or (None) every account's."""
        if account_id is None:
            pending, self._pending = self._pending, {}
            for account, stated in pending.items():
                self._fold_one(account, stated)
            return
        if account_id in self._pending:
            self._fold_one(account_id, self._pending.pop(account_id))

    def _fold_one(self, account_id: str, stated: RateLimits) -> None:
        for kind, observation in observations_of(stated).items():
            if self.merge(account_id, kind, observation):
                for listener in self.observed_listeners:
                    listener(account_id, kind, observation)

    def merge(self, account_id: str, kind: str, observation: Observation) -> bool:
        """Keep `observation` if it is the newest of its account and kind; True when kept."""
        if account_id not in self.accounts or kind not in RATE_LIMIT_KINDS:
            return False
        kinds = self._held.setdefault(account_id, {})
        if not newer(kinds.get(kind), observation):
            return False
        kinds[kind] = observation
        return True

    # ---- what the mint asks -----------------------------------------------------------------------

    def low(self, account_id: str, floor_percent: int, now: int) -> bool:
        if floor_percent <= 0:
            return False
        self.fold(account_id)
        return bool(low_kinds(self._held.get(account_id, {}), floor_percent, now))

    def lifts_at(self, account_id: str, floor_percent: int, now: int) -> int | None:
        self.fold(account_id)
        return lifts_at(self._held.get(account_id, {}), floor_percent, now)

    # ---- out --------------------------------------------------------------------------------------

    def view(self, account_id: str, now: int) -> dict[str, KindView]:
        """kind → its latest observation (every kind the account's answers reported)."""
        self.fold(account_id)
        return {
            kind: KindView(
                limit=o.limit,
                remaining=o.remaining,
                reset_at=None if o.reset_at_ms is None else iso_ms(o.reset_at_ms),
                observed_at=iso_ms(o.observed_at_ms),
                headroom_percent=_rounded(o),
                current=current(o, now),
            )
            for kind, o in sorted(
                self._held.get(account_id, {}).items(), key=lambda item: RATE_LIMIT_KINDS.index(item[0])
            )
        }

    def refresh_floors(self, _written: object = None) -> None:
        """Read the policy's floors (each tick, and after each policy write); a chain that
        cannot be read now leaves the last ones in place."""
        try:
            self._floors = tuple(self.floors())
        except Exception:  # fleet: not validated yet, Redis away; the next tick reads again
            pass

    def check(self, account_id: str, now: int, floors: tuple[int, ...]) -> None:
        """Publish a `headroom` event for every floor the account crossed (below, or recovered)."""
        if self.events is None:
            return
        self.fold(account_id)
        held = self._held.get(account_id, {})
        below = frozenset(f for f in floors if low_kinds(held, f, now))
        was = self._below.get(account_id, frozenset())
        if below == was:
            return
        self._below[account_id] = below
        for floor, is_below in crossings(was, below):
            kinds = low_kinds(held, floor, now) if is_below else ()
            lifts = lifts_at(held, floor, now) if is_below else None
            self.events.publish(
                EventKind.HEADROOM,
                {
                    "account_id": account_id,
                    "floor_percent": floor,
                    "state": "below" if is_below else "recovered",
                    "kinds": list(kinds),
                    "lifts_at": None if lifts is None else iso_ms(lifts),
                    "at": iso_ms(now),
                },
            )

    def tick(self) -> None:
        """Every account, against the policy's floors now: resets that passed, fleet merges."""
        self.refresh_floors()
        now = self.clock()
        for account_id in set(self.held) | set(self._below):  # `held` folds what is pending
            self.check(account_id, now, self._floors)

    async def maintain(self, tick_s: float = TICK_S) -> None:
        await every(tick_s, self.tick, "headroom_upkeep_failed")

    def background(self, _app: object) -> AsyncIterator[None]:
        """The HTTP app's `cleanup_ctx` (`shared.http1.app`): `maintain` runs while the app does."""
        return while_app_runs(self.maintain)

    def gauges(self) -> HeadroomGauges:
        return HeadroomGauges(self)


def supersedes(new: RateLimits, old: RateLimits) -> bool:
    """`new` makes `old` moot unread: it restates every kind `old` stated, and it is not older.

    Times compare as text only in the data plane's own form (`iso_ms`: 24 characters, UTC `Z`),
    where text order is time order; any other form is folded, not compared. The data plane
    range-checks what it reports as control does (`core.headroom.valid`), so a kind restated is
    a kind kept."""
    at, was = new.observed_at, old.observed_at
    return (
        len(at) == len(was) == ISO_MS_LEN
        and at[-1] == was[-1] == "Z"
        and at >= was
        and (old.requests is None or new.requests is not None)
        and (old.tokens is None or new.tokens is not None)
        and (old.input_tokens is None or new.input_tokens is not None)
        and (old.output_tokens is None or new.output_tokens is not None)
    )


def _rounded(observation: Observation) -> float | None:
    share = headroom_percent(observation)
    return None if share is None else round(share, 1)


class HeadroomGauges:
    """`leasehold_account_ratelimit_{remaining,limit}{account_id,kind}`: each kind's latest
    observation, while its reset has not passed (after it, the value no longer holds)."""

    def __init__(self, book: HeadroomBook) -> None:
        self.book = book

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        now = self.book.clock()
        remaining = GaugeMetricFamily(
            "leasehold_account_ratelimit_remaining",
            "The provider's rate limit left, by account and kind (latest answer).",
            labels=["account_id", "kind"],
        )
        limit = GaugeMetricFamily(
            "leasehold_account_ratelimit_limit",
            "The provider's rate limit, by account and kind (latest answer).",
            labels=["account_id", "kind"],
        )
        held = self.book.held
        for account_id in sorted(held):
            for kind, o in sorted(held[account_id].items()):
                if o.reset_at_ms is not None and o.reset_at_ms <= now:
                    continue
                remaining.add_metric([account_id, kind], o.remaining)
                if o.limit is not None:
                    limit.add_metric([account_id, kind], o.limit)
        yield remaining
        yield limit


def policy_floors(policy: Any) -> Callable[[], tuple[int, ...]]:
    """Every distinct `min_headroom_percent` the policy store's levels set (a `PolicyStore`)."""

    def floors() -> tuple[int, ...]:
        view = policy.read()
        if not policy.believable(view):
            return ()
        return floors_of(document.min_headroom_percent for document in view.state.documents.values())

    return floors
