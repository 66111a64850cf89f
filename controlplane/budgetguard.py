"""`BudgetGuard`: SPEC §18's enforcement — the shell around `core.budgetwatch.BudgetWatch`.

It keeps the watch current and acts on what changes:
- **current**: every recorded row (a row listener, after the spend book folded it), every
  policy write (a listener of the store; and a revision check at each mint and each tick, for
  a write another process made), and the end of each hour (`maintain` sleeps until then);
- **events**: one `budget` event per crossing of 80 % and 100 % of a budget in a window;
- **gates**: every lease control pushes carries its gate (`gate`: `Lease.budgeted`, and while a
  budget of its chain is exhausted `Lease.budget_retry_at_ms`, the latest reset among them), in
  the grant and in the snapshot; when gates change — a budget exhausted, a window reset, a
  policy write adding or removing a budget — every live lease's gate is pushed again
  (`LeaseGates`, acknowledged). The data plane refuses the next request of a held lease 429
  `budget-exhausted` and lets requests through from the reset on by itself; an attempt already
  in flight is never touched, so the overshoot is what was in flight (`overshoot_usd`);
- **the mint's facts**: `exhausted` (a chain's budgets, for the v2 mint and explain),
  `hold_of` (the v1 mint), `on_chain` (renewal), `is_priced`.

Fleet mode (SPEC §19): while the fleet's spend is stale (`stale`, from `FleetSpend`: no refresh
for `STALE_S`), every budgeted chain's mint is held 503 `fleet-state-unavailable`
(`exhausted` and `hold_of` raise `StateUnavailable`) and every budgeted lease's gate carries
`budget_stale`, so its requests are refused the same way; unbudgeted scopes are untouched.
`on_stale_change` pushes the gates when that flips.

A policy chain that cannot be believed changes nothing here: the last believable budgets stay
enforced (every v2 mint is held `policy-unavailable` meanwhile anyway). The gates are computed,
never stored: the key journal keeps leases as minted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

import msgspec

from controlplane.core.budgets import Exhausted, LevelBudget, all_budgets
from controlplane.core.budgetwatch import NO_CHANGE, BudgetWatch, Change, Crossing
from controlplane.core.pricing import PriceLookup, PriceTable
from controlplane.core.spendscopes import TenancyMap
from controlplane.core.windows import iso
from controlplane.events import EventHub, EventKind
from controlplane.replication import DataPlaneLink
from controlplane.spend import SpendBook
from controlplane.stores.keys import KeyTable
from controlplane.stores.policy import PolicyStore
from controlplane.upkeep import while_app_runs
from shared.capacity import StateUnavailable
from shared.logging import get_logger
from shared.wire import AttemptRow, Lease, LeaseGate

log = get_logger("budgets")

TICK_S = 5.0  # how late a policy write made by another process is seen (its own are at once)


class BudgetGuard:
    def __init__(
        self,
        book: SpendBook,
        policy: PolicyStore,
        keys: KeyTable,
        link: DataPlaneLink,
        events: EventHub,
        prices: PriceTable,
        stale: Callable[[], bool] = lambda: False,
    ) -> None:
        self.book = book
        self.clock = book.clock
        self.policy = policy
        self.keys = keys
        self.link = link
        self.events = events
        self.watch = BudgetWatch()
        self.revision: int | None = None  # the policy revision the watch was configured at
        self._price_of = PriceLookup(prices)
        self._dirty = False
        self._pushing: asyncio.Task[None] | None = None
        self.stale = stale  # fleet mode: `FleetSpend.stale` (SPEC §19: stale fleet spend holds budgeted scopes)
        link.priced = sorted({pattern for price in prices.price for pattern in price.models})

    # ---- keeping the watch current ----------------------------------------------------------

    def start(self) -> None:
        """At wiring, before the RPC socket opens: the first snapshot carries every gate. What
        it finds already crossed was announced by an earlier process: no event for it."""
        self.sync(quiet=True)

    def on_row(self, row: AttemptRow) -> None:
        if row.cost_usd and self.watch.budgets:  # else nothing to count: not even the clock is read
            change = self.watch.add(row, self.book.cells, self.clock())
            if change is not NO_CHANGE:
                self._apply(change)

    def on_policy_write(self, _written: object) -> None:
        self.sync()

    def sync(self, quiet: bool = False) -> None:
        """Configure the watch from the policy chain, unless it is at that revision already.
        A chain not readable yet (fleet mode: not validated before the host started) is left
        for the next policy write or tick."""
        try:
            view = self.policy.read()
        except StateUnavailable:
            return
        if not self.policy.believable(view) or view.check.revision == self.revision:
            return
        state = view.state
        assert state is not None
        budgets = all_budgets(state.documents)
        change = self.watch.configure(
            budgets, TenancyMap(team_of=state.team_of, org_of=state.org_of), self.book.cells, self.clock(), quiet=quiet
        )
        self.revision = view.check.revision
        log.info(
            "budgets_configured",
            policy_revision=self.revision,
            budgets=len(budgets),
            exhausted=len(self.watch.exhausted(budgets, self.clock())),
        )
        self._apply(change)

    def on_fleet_spend(self, quiet: bool = False) -> None:
        """Fleet mode: another host's published spend changed (`FleetSpend`); every budget is
        re-read from the fleet's cells. `quiet` at the start: what it finds crossed was
        announced before."""
        if self.watch.budgets:
            self._apply(self.watch.reseed(self.book.cells, self.clock(), quiet=quiet))

    def tick(self) -> None:
        self.sync()
        now = self.clock()
        if self.watch.budgets and now >= self.watch.until_ms:
            self._apply(self.watch.reseed(self.book.cells, now))

    async def maintain(self, tick_s: float = TICK_S) -> None:
        while True:
            wait_s = tick_s
            if self.watch.budgets:  # wake at the hour's end: a window may reset then
                wait_s = min(tick_s, max(0.01, (self.watch.until_ms - self.clock()) / 1000 + 0.01))
            await asyncio.sleep(wait_s)
            try:
                self.tick()
            except Exception:  # upkeep must outlive any one bad pass
                log.exception("budget_upkeep_failed")

    def background(self, _app: object) -> AsyncIterator[None]:
        """The HTTP app's `cleanup_ctx` (`shared.http1.app`): `maintain` runs while the app does."""
        return while_app_runs(self.maintain)

    # ---- what the mint asks -----------------------------------------------------------------

    def exhausted(self, budgets: Sequence[LevelBudget], revision: int | None = None) -> tuple[Exhausted, ...]:
        """Which of a resolved chain's `budgets` are exhausted now (the watch is brought to the
        chain's `revision` first, so a mint never judges by older budgets than it resolved)."""
        if not budgets:
            return ()
        self._held_if_stale()
        if revision is not None and revision != self.revision:
            self.sync()
        return self.watch.exhausted(budgets, self.clock())

    def on_chain(self, repo_slug: str, worker_role: str | None) -> tuple[LevelBudget, ...]:
        return self.watch.on_chain(repo_slug, worker_role)

    def hold_of(self, repo_slug: str, worker_role: str | None) -> tuple[Exhausted, ...]:
        """The exhausted budgets of a (repo, role)'s chain now: what holds a v1 mint."""
        budgets = self.watch.on_chain(repo_slug, worker_role)
        if budgets:
            self._held_if_stale()
        return self.watch.exhausted(budgets, self.clock())

    def _held_if_stale(self) -> None:
        if self.stale():
            raise StateUnavailable("the fleet's spend could not be refreshed lately; budgeted mints are held")

    def on_stale_change(self, _stale: bool) -> None:
        """Fleet mode: the fleet's spend went stale, or fresh again: every gate is pushed."""
        self._apply(Change(crossings=(), gates_changed=True))

    def is_priced(self, model: str) -> bool:
        return self._price_of(model) is not None

    # ---- gates --------------------------------------------------------------------------------

    def gate(self, lease: Lease) -> Lease:
        """The lease as the data plane must hold it now."""
        budgeted, retry_at_ms = self.watch.gate(lease.repo_slug, lease.worker_role, self.clock())
        stale = budgeted and self.stale()
        if (budgeted, retry_at_ms, stale) == (lease.budgeted, lease.budget_retry_at_ms, lease.budget_stale):
            return lease
        return msgspec.structs.replace(lease, budgeted=budgeted, budget_retry_at_ms=retry_at_ms, budget_stale=stale)

    def _apply(self, change: Change) -> None:
        for crossing in change.crossings:
            self._announce(crossing)
        if change.gates_changed:
            self._dirty = True
            if self._pushing is None:
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:  # wiring, not serving yet: the first snapshot carries the gates
                    return
                self._pushing = loop.create_task(self._push())

    async def _push(self) -> None:
        """Push every live lease's gate until none changed meanwhile (one push in flight)."""
        try:
            while self._dirty:
                self._dirty = False
                now, stale = self.clock(), self.stale()
                gates = []
                for lease in self.keys.all():
                    budgeted, retry_at_ms = self.watch.gate(lease.repo_slug, lease.worker_role, now)
                    gates.append(
                        LeaseGate(
                            key_id=lease.key_id,
                            budgeted=budgeted,
                            budget_retry_at_ms=retry_at_ms,
                            budget_stale=budgeted and stale,
                        )
                    )
                held = await self.link.gates_changed(gates) if gates else True
                log.info(
                    "budget_gates_pushed",
                    leases=len(gates),
                    held=sum(1 for g in gates if g.budget_retry_at_ms is not None),
                    dataplane=held,
                )
        finally:
            self._pushing = None

    def _announce(self, crossing: Crossing) -> None:
        fields = {
            "level": crossing.level,
            "window": str(crossing.window),
            "usd": crossing.usd,
            "spent_usd": crossing.spent_usd,
            "threshold": crossing.threshold,
            "window_start": iso(crossing.window_start_ms),
            "resets_at": iso(crossing.resets_at_ms),
        }
        if crossing.threshold >= 100:
            log.warning("budget_exhausted", **fields)
        else:
            log.info("budget_threshold_reached", **fields)
        self.events.publish(EventKind.BUDGET, fields)
