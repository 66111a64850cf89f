"""A fleet host's part in account-wide revocation (SPEC §16): `HostRevocation`.

`revoke-leases` on any host asks every live host to end the account's leases and answers once
each acknowledged (`revoke_account`, the admin route's revoker in fleet mode); each host serves
the requests from the fleet's revocation stream (`on_request`, the `revocations` loop) through
the release seam's port (`controlplane/ports.KeyEnder`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controlplane.fleet.events import RevokeRequest
from controlplane.ports import KeyEnder
from controlplane.stores.admin import Revocation
from shared.logging import get_logger

if TYPE_CHECKING:
    from controlplane.fleet.wiring import FleetBackends

log = get_logger("fleet")


class HostRevocation:
    def __init__(self, backends: FleetBackends, host_id: str, seam: KeyEnder) -> None:
        self.b = backends
        self.host_id = host_id
        self.seam = seam

    async def revoke_account(self, account_id: str) -> Revocation:
        """`revoke-leases` (SPEC §16): every live host ends the account's leases; answers once
        each acknowledged, naming those that did not within the bound."""
        live = set(await self.b.hosts.live_hosts()) | {self.host_id}
        answer = await self.b.revocations.request(account_id, sorted(live))
        if answer.missing:
            log.warning("fleet_revocation_unacknowledged", account_id=account_id, hosts=list(answer.missing))
        return Revocation(revoked=answer.revoked, unacknowledged_hosts=answer.missing)

    async def on_request(self, request: RevokeRequest) -> int:
        return await self.seam.end_account_keys(request.account_id)
