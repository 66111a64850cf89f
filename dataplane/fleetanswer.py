"""A ceilinged request's fleet admission, awaited at the last moment (issue 27, SPEC §16).

The proxy writes the reserve to Redis after every local check (`Proxy._admit`) and the relay
prepares the upstream request while Redis answers: the pool slot when one is free, the URL, the
headers with the credential, the watch, the request head, a kept-alive connection. `FleetAnswer`
is awaited right before the first byte goes upstream (`UpstreamClient.request`'s `ready`), or
before the pool slot is waited for when none is free (a refused request never waits for one):
no slot is 429 `request-capacity-exhausted`, Redis unable to say 503 `fleet-state-unavailable`,
the same refusals, rows and logs as when the answer was awaited first; nothing went upstream.
Between the write and the ask there is no suspension point, so a worker gone, the drain or the
headers bound lands in the awaited answer (its holder in `pending_release`, as before); a
request that ends without asking (a failure before the write) abandons it: the holder is
released, never leaked (`PendingReserve.abandon`).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from dataplane.attempt import Attempt
from dataplane.errors import refuse
from dataplane.watch import ExchangeWatch
from shared.capacity import StateUnavailable
from shared.codes import Refusal
from shared.http1.response import StreamResponse
from shared.wire import AccountRoute

if TYPE_CHECKING:  # fleet mode only (redis-py)
    from dataplane.admission import PendingReserve


def capacity_exhausted(attempt: Attempt, account: AccountRoute) -> StreamResponse:
    """No request slot for the attempt: 429 `request-capacity-exhausted` (here or fleet-wide)."""
    return refuse(
        attempt, Refusal.REQUEST_CAPACITY_EXHAUSTED, f"account {account.id} is at its request capacity", retry_after_s=1
    )


def ceiling_unchecked(attempt: Attempt, account: AccountRoute) -> StreamResponse:
    """Redis could not say whether a slot is free: 503 `fleet-state-unavailable`, never a guess."""
    return refuse(
        attempt,
        Refusal.FLEET_STATE_UNAVAILABLE,
        f"account {account.id}'s fleet-wide request ceiling cannot be checked now",
        retry_after_s=1,
    )


class FleetAnswer:
    __slots__ = ("attempt", "account", "pending", "watch", "answered_at")

    def __init__(self, attempt: Attempt, account: AccountRoute, pending: PendingReserve) -> None:
        self.attempt = attempt
        self.account = account
        self.pending = pending
        self.watch: ExchangeWatch | None = None  # the exchange's, once the relay set it up
        self.answered_at = 0.0  # perf_counter when the answer came: the upstream's wait begins

    async def __call__(self) -> StreamResponse | None:
        """The refusal when the slot was not taken, else None (go ahead). Once."""
        attempt, account = self.attempt, self.account
        asked = time.perf_counter()
        try:
            admitted = await self.pending.answer()
        except StateUnavailable:
            return self._unavailable()
        except asyncio.CancelledError:
            watch = self.watch
            if watch is not None and watch.timed_out():  # the headers bound ran out on Redis's wait
                return self._unavailable()
            raise
        answered_at = self.answered_at = time.perf_counter()
        if self.watch is not None:  # the headers bound counts the upstream's wait, not Redis's
            self.watch.headers_deadline += answered_at - asked
        return None if admitted else capacity_exhausted(attempt, account)

    def _unavailable(self) -> StreamResponse:
        return ceiling_unchecked(self.attempt, self.account)

    def abandon(self) -> None:
        """Not asked (the request failed before): the holder released, never leaked; nothing
        once asked."""
        self.pending.abandon()
