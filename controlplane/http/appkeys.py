"""Every `AppKey` of the control app, in one place: what `build_app` hands the handlers.

Handlers import their collaborators' keys from here, never from one another, so a handler
module depends on the stores and services it reads, and on no other handler.
"""

from __future__ import annotations

from controlplane.events import EventHub
from controlplane.fleet.snapshot import FleetSource
from controlplane.headroom import HeadroomBook
from controlplane.metrics import GatewayMetrics
from controlplane.mint import MintDesk
from controlplane.ports import ControlReads
from controlplane.spend import SpendBook
from controlplane.stores.admin import AccountAdminStore
from controlplane.stores.policy import PolicyStore
from shared.http1 import web

READS = web.AppKey("control_reads", ControlReads)  # the read ports (`controlplane/ports.py`)
V1_KEYS = web.AppKey("v1_keys", object)  # a `controlplane.ports.V1Keys`: SPEC §5's mint and revoke
DESK = web.AppKey("mint_desk", MintDesk)
ADMIN_STORE = web.AppKey("account_admin_store", AccountAdminStore)
LEASE_REVOKER = web.AppKey("account_lease_revoker", object)  # a `stores.admin.Revoker`
POLICY_STORE = web.AppKey("policy_store", PolicyStore)
HUB = web.AppKey("event_hub", EventHub)
HEARTBEAT = web.AppKey("event_heartbeat_s", float)
METRICS = web.AppKey("metrics", GatewayMetrics)
ASSETS = web.AppKey("dashboard_assets", dict)  # name -> (bytes, content type)
SPEND_BOOK = web.AppKey("spend_book", SpendBook)
SPEND_POLICY = web.AppKey("spend_policy", PolicyStore)
# embedded: a fleet of one; else Redis (SPEC §16)
FLEET = web.AppKey("fleet_view", FleetSource)  # type: ignore[type-abstract]
TRACES = web.AppKey("traces", object)  # a `controlplane.traces.Traces`, or None: export off (SPEC §21)
HEADROOM = web.AppKey("headroom", HeadroomBook)  # provider rate-limit headroom (SPEC §22)

__all__ = [
    "READS",
    "V1_KEYS",
    "DESK",
    "ADMIN_STORE",
    "LEASE_REVOKER",
    "POLICY_STORE",
    "HUB",
    "HEARTBEAT",
    "METRICS",
    "ASSETS",
    "SPEND_BOOK",
    "SPEND_POLICY",
    "FLEET",
    "TRACES",
    "HEADROOM",
]
