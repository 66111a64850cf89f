"""`Books`: spend and budgets (SPEC §18), headroom (SPEC §22), and in fleet mode their fleet-wide
halves, built by `build_books` for `controlplane.wiring.wire` before the service whose row sinks
they are. None of them sees the service: rows reach them through `ControlService.row_sinks`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from controlplane.budgetguard import BudgetGuard
from controlplane.core.pricing import PriceTable
from controlplane.events import EventHub
from controlplane.fleet import backends
from controlplane.headroom import HeadroomBook, policy_floors
from controlplane.replication import DataPlaneLink
from controlplane.spend import SpendBook
from controlplane.stores.keys import KeyTable
from controlplane.stores.ledger import Ledger
from controlplane.stores.policy import PolicyStore
from shared.settings import Settings

if TYPE_CHECKING:  # fleet mode's modules (and the Redis client) load only in fleet mode
    from controlplane.fleet.headroom import FleetHeadroom
    from controlplane.fleet.spend import FleetSpend


class Books(NamedTuple):
    """Spend and budgets (SPEC §18), headroom (SPEC §22), and in fleet mode their fleet-wide halves."""

    spend: SpendBook
    budgets: BudgetGuard
    headroom: HeadroomBook
    fleet_spend: FleetSpend | None
    fleet_headroom: FleetHeadroom | None


def build_books(
    settings: Settings,
    shared: backends.Backends,
    ledger: Ledger,
    policy: PolicyStore,
    keys: KeyTable,
    link: DataPlaneLink,
    events: EventHub,
    prices: PriceTable,
    account_ids: list[str],
) -> Books:
    """The spend book, rebuilt before the RPC socket opens (no row is missed), and in fleet mode
    the fleet's spend over it; the budgets over both, the exhausted ones known before the first
    snapshot; headroom. Policy writes reach the budgets and the headroom floors; the fleet's spend
    and the fleet's headroom subscribe to each other's halves (each reads the other)."""
    spend = SpendBook.rebuild(ledger)
    fleet_spend = None if shared.fleet is None else _fleet_spend(shared.fleet, settings, spend)
    budgets = (
        BudgetGuard(spend, policy, keys, link, events, prices)
        if fleet_spend is None
        else BudgetGuard(spend, policy, keys, link, events, prices, stale=fleet_spend.stale)
    )  # SPEC §19
    budgets.start()
    headroom = HeadroomBook(frozenset(account_ids), events, policy_floors(policy))  # SPEC §22
    headroom.refresh_floors()
    policy.write_listeners.extend((budgets.on_policy_write, headroom.refresh_floors))
    fleet_headroom = None
    if shared.fleet is not None and fleet_spend is not None:
        from controlplane.fleet.headroom import FleetHeadroom

        fleet_spend.listeners.append(budgets.on_fleet_spend)
        fleet_spend.stale_listeners.append(budgets.on_stale_change)
        fleet_headroom = FleetHeadroom(
            shared.fleet.client, shared.fleet.keys, settings.host_id, headroom, entries=shared.fleet.entries
        )
        headroom.observed_listeners.append(fleet_headroom.note)
        headroom.on_pending = fleet_headroom.wake  # its publish folds the pending rows in
    return Books(spend, budgets, headroom, fleet_spend, fleet_headroom)


def _fleet_spend(shared: Any, settings: Settings, spend: SpendBook) -> FleetSpend:
    """Fleet mode (imported only here): the fleet's spend that views and budgets read (SPEC §18)."""
    from controlplane.fleet.spend import FleetSpend

    return FleetSpend(  # its publish and pulls batched like the mint's reads (issue 27 §4)
        shared.batching, shared.keys, settings.host_id, spend, entries=shared.entries, supervisor=shared.supervisor
    )
