"""The socket's gates by table (SPEC §16, §19, §20): the fleet hold is the HTTP proxy's own rule
(`fleethold.fleet_held`), and a disabled account ends a socket's rights (1008) where a drain
does not."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from dataplane.fleethold import fleet_held
from dataplane.leases import LeaseReplica
from dataplane.websocket import gates
from shared.codes import Refusal
from shared.wire import AccountRoute, Lease

NOW = 1_800_000_000_000


class FakeFleet:
    """What the rule reads of a `FleetAdmission`: `hold()` (a lapsed place or failing loops)."""

    def __init__(self, held: str | None, lapsed: bool = False) -> None:
        self.held = held
        self.lapsed = lapsed

    def hold(self) -> str | None:
        return self.held


def route(request_capacity: int | None = None, lease_capacity: int | None = None) -> AccountRoute:
    return AccountRoute(
        id="acct",
        provider_binding="openai",
        wire="openai",
        base_url="http://127.0.0.1:9",
        auth_style="bearer",
        credential_env="GATEWAY_X_KEY",
        request_capacity=request_capacity,
        lease_capacity=lease_capacity,
        models=("gpt-*",),
    )


class Case(NamedTuple):
    name: str
    fleet: FakeFleet | None
    account: AccountRoute
    held: bool


LOOP = "this gateway host's fleet loop standing keeps failing"
CASES = [
    Case("embedded", None, route(request_capacity=1), False),
    Case("no-ceiling-served-while-failing", FakeFleet(LOOP), route(), False),
    Case("request-ceiling-held-while-a-loop-fails", FakeFleet(LOOP), route(request_capacity=1), True),
    Case("lease-ceiling-held-while-a-loop-fails", FakeFleet(LOOP), route(lease_capacity=1), True),
    Case("ceiling-served-when-current", FakeFleet(None), route(lease_capacity=1), False),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_socket_gate_holds_exactly_where_http_does(case: Case) -> None:
    replica = LeaseReplica(env={})
    lease = Lease(key_id="k", digest=b"\x00" * 32, account_id="acct", expires_at_ms=NOW + 60_000)
    got = gates.hold(replica, lease, case.account, "gpt-5", NOW, case.fleet)  # type: ignore[arg-type]
    assert (fleet_held(case.fleet, case.account) is not None) == case.held  # type: ignore[arg-type]
    if case.held:
        assert got is not None and got.code is Refusal.FLEET_STATE_UNAVAILABLE and got.status == 503
        assert LOOP in got.message
    else:
        assert got is None


@pytest.mark.parametrize(
    "disabled,close_code",
    [((), None), (("other",), None), (("acct",), gates.POLICY_VIOLATION)],
)
def test_a_disabled_account_ends_the_socket_1008(disabled: tuple[str, ...], close_code: int | None) -> None:
    replica = LeaseReplica(env={})
    lease = Lease(key_id="k", digest=b"\x00" * 32, account_id="acct", expires_at_ms=NOW + 60_000)
    replica.load([lease], [route()], True, disabled=list(disabled))
    ending = gates.standing(replica, lease, NOW, draining=False)
    assert (None if ending is None else ending.close_code) == close_code
    if ending is not None:
        assert ending.refusal.code is Refusal.ADMINISTRATIVE_DISABLED and ending.refusal.status == 409
        assert gates.disabled(replica, "acct") == ending.refusal  # the handshake's refusal too


def test_a_hop_closes_1012_before_a_disable_closes_1008() -> None:
    """A dispatch key moving off a disabled account: the reconnect reaches its new account."""
    replica = LeaseReplica(env={})
    lease = Lease(
        key_id="k", digest=b"\x00" * 32, account_id="acct", expires_at_ms=NOW + 60_000, hop_on=("rate-limited",)
    )
    replica.load([lease], [route()], True, disabled=["acct"])
    replica.hop_pending(lease, "rate-limited", None)
    ending = gates.standing(replica, lease, NOW, draining=False)
    assert ending is not None and ending.close_code == gates.SERVICE_RESTART
