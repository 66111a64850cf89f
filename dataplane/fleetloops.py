"""The data plane's fleet loops, supervised (SPEC §16, §19): fleet mode only.

Two loops read the fleet's Redis from the data plane: `upkeep` (a start that failed is redone,
releases Redis could not take are retried) and `standing` (this host's heartbeat age, so the data
plane stops serving ceilinged accounts before the fleet may reuse this host's slots). Each runs
under a `Supervisor` (`shared/supervisor.py`): Redis away (`StateUnavailable`) is expected
and waited out; anything else that escapes a pass is logged (`fleet_loop_failed`) and counted,
and the loop runs again after a pause, never dying in silence. Each pass runs before its sleep,
so a pass that raises ends its run at once and three in a row make the loop `failing`; each turn
first asks whether its task is being cancelled (redis-py can swallow a cancel into a reply).
Imported only in fleet mode (it brings redis-py).

`FleetAdmission.hold` (the pure rule: `hold_reason`) is what the proxy applies to a ceilinged
account (a lease or a request ceiling): refused 503 `fleet-state-unavailable` while this host's
place lapsed, or while one of these loops keeps failing — the state it keeps is then stale, and
a ceiling is never served on stale state. Accounts without a ceiling keep serving.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from shared.capacity import StateUnavailable
from shared.fleet.redis_client import raise_if_cancelled
from shared.wire import LoopReport

if TYPE_CHECKING:  # fleet mode only (it brings redis-py)
    from dataplane.admission import FleetAdmission

# How often fleet mode retries a failed start and the releases Redis could not take.
FLEET_UPKEEP_S = 1.0
# How soon the standing loop reads the heartbeat again while this host's place is lapsed.
LAPSED_RECHECK_S = 0.1


async def upkeep(fleet: FleetAdmission, interval_s: float = FLEET_UPKEEP_S) -> None:
    """Releases that failed while Redis was away are retried; a start that failed is redone."""
    while True:
        raise_if_cancelled()  # redis-py may have consumed a cancel: never loop on past one
        try:
            if not fleet.started:
                await fleet.start()
            await fleet.retry_pending()
        except StateUnavailable:
            pass
        await asyncio.sleep(interval_s)


async def standing(fleet: FleetAdmission, after: Callable[[], None] = lambda: None) -> None:
    """This host's heartbeat age, read often enough to stop serving ceilinged accounts before
    the fleet may reuse this host's slots (`FleetAdmission.check_standing`); `after` each pass."""
    while True:
        raise_if_cancelled()
        try:
            await fleet.check_standing()
        except StateUnavailable:
            pass
        after()
        # while lapsed, read again soon: a place that lapsed only because this host's control had
        # not heartbeated yet (both daemons start at once) is restored within LAPSED_RECHECK_S
        await asyncio.sleep(LAPSED_RECHECK_S if fleet.lapsed else fleet.check_interval_s)


class LoopReporter:
    """Sends the loops' statuses to control (`ControlLink.loops`) when they changed: after each
    failure, and after each `standing` pass (a loop that runs steadily again reads `running`)."""

    def __init__(self, fleet: FleetAdmission, send: Callable[[list[LoopReport]], None]) -> None:
        self.fleet = fleet
        self.send = send
        self.last: list[LoopReport] = []

    def __call__(self) -> None:
        reports = self.fleet.supervisor.reports()
        if reports != self.last:
            self.last = reports
            self.send(reports)


def spawn(fleet: FleetAdmission, send: Callable[[list[LoopReport]], None] | None = None) -> list[asyncio.Task[None]]:
    """Start both loops under the fleet admission's supervisor; `send` hears their statuses."""
    report = LoopReporter(fleet, send) if send is not None else (lambda: None)
    fleet.supervisor.on_failure = report
    return [
        fleet.supervisor.spawn("upkeep", lambda: upkeep(fleet)),
        fleet.supervisor.spawn("standing", lambda: standing(fleet, report)),
    ]
