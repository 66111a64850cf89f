"""The accounts an operator disabled, told to the data plane (SPEC §9, §20): `DisabledAccounts`.

A socket never outlives its lease's rights, and a disable ends them (SPEC §20): the data plane
refuses each new `response.create` on a disabled account's sockets and closes them 1008 once
their responses in flight finished. The data plane holds no chain, so control tells it the
whole set (`DataPlaneLink.accounts_disabled`) whenever it changes:
- a commit on this host: `AccountAdminStore.set_state` awaits `sync` before it answers, so a
  PATCH that returned has reached the data plane (as a revoke has, SPEC §3);
- an `account.state` event, which in fleet mode also brings another host's commit (the fleet
  event relay re-reads the chain first, `controlplane/fleet/hostevents.py`);
- every `TICK_S` (`background`): the fleet's pub/sub is at most once, so a commit whose event
  was lost is seen on the next tick after the chain poll validated it (the propagation bound
  of SPEC §16 is the chain poll's plus a tick);
- and every snapshot carries the last set, so a data plane that reconnects has it.

A chain that cannot be read now (corrupt, or not validated lately in fleet mode) changes
nothing: the last set stands. A fault lifts no disable, and is no disable either (it holds
mints, SPEC §9, not sockets).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence

from controlplane.core.overlay import Overlay, disabled_accounts
from controlplane.events import Event, EventKind
from controlplane.replication import DataPlaneLink
from controlplane.upkeep import every, while_app_runs
from shared.capacity import StateUnavailable
from shared.logging import get_logger

log = get_logger("admin")

TICK_S = 0.5  # the fleet's chain poll (`hostevents.CHAIN_POLL_S`) runs as often


class DisabledAccounts:
    """`overlay` is the admin store's (None while its chain is corrupt); `link` the data plane's."""

    def __init__(self, overlay: Callable[[], Overlay | None], link: DataPlaneLink, account_ids: Sequence[str]) -> None:
        self.overlay = overlay
        self.link = link
        self.account_ids = tuple(account_ids)
        self.known: tuple[str, ...] = ()  # the set as the chain last said it
        self.told: tuple[str, ...] = ()  # the set last handed to the link (as it starts: none)
        self._last: asyncio.Task[bool] | None = None  # the push of `told`
        self._pushes: set[asyncio.Task[bool]] = set()  # every push under way, held till it ends

    def read(self) -> tuple[str, ...]:
        """The disabled accounts as the chain says now; the last set read while it cannot say."""
        try:
            overlay = self.overlay()
        except StateUnavailable:
            overlay = None
        if overlay is not None:
            self.known = disabled_accounts(overlay, self.account_ids)
        return self.known

    async def sync(self) -> bool:
        """The data plane has the set as the chain says it now: pushed if it changed, and the
        push under way awaited either way (an event's push may have started it); True once the
        data plane acknowledged, False when none is linked (its next snapshot carries it)."""
        self.kick()
        last = self._last
        return True if last is None else await asyncio.shield(last)

    def kick(self) -> None:
        """Hand the set to the link when it changed since it was last handed (an event listener,
        the tick, `sync`); pushes run in order, each carrying the whole set."""
        now = self.read()
        if now == self.told:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop runs (a publish outside the daemon): the tick will see it
            return
        self.told = now
        log.info("accounts_disabled_pushed", accounts=list(now))
        self._last = task = loop.create_task(self.link.accounts_disabled(now))
        self._pushes.add(task)
        task.add_done_callback(self._pushes.discard)

    def on_event(self, event: Event) -> None:
        """An `EventHub` listener: an `account.state` event (this host's commit or, in fleet
        mode, another host's, relayed after the chain was re-read) may change the set."""
        if event.kind == EventKind.ACCOUNT_STATE:
            self.kick()

    async def maintain(self, tick_s: float = TICK_S) -> None:
        await every(tick_s, self.kick, "accounts_disabled_upkeep_failed")

    def background(self, _app: object) -> AsyncIterator[None]:
        """The HTTP app's `cleanup_ctx` (`shared.http1.app`): `maintain` runs while the app does."""
        return while_app_runs(self.maintain)
