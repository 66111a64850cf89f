"""The data plane's `/healthz` decision and its probe's address, by table (SPEC §12)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from dataplane.health import Health, health_of
from dataplane.probe import healthz_url


@dataclass(frozen=True)
class Case:
    name: str
    synchronised: bool
    connected: bool
    draining: bool
    leases: int
    expect: tuple[int, Health]


CASES = [
    Case("synchronised", True, True, False, 3, (200, Health(status="ok", control="synchronised", leases=3))),
    Case(
        "no control link: fails closed, no lease",
        False,
        False,
        False,
        0,
        (503, Health(status="unavailable", control="disconnected", leases=0)),
    ),
    Case(
        "linked, snapshot not yet in",
        False,
        True,
        False,
        0,
        (503, Health(status="unavailable", control="connecting", leases=0)),
    ),
    Case(
        "draining after SIGTERM",
        True,
        True,
        True,
        2,
        (503, Health(status="draining", control="synchronised", leases=2)),
    ),
    Case(
        "draining without control",
        False,
        False,
        True,
        0,
        (503, Health(status="unavailable", control="disconnected", leases=0)),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_health_of(case: Case) -> None:
    assert health_of(case.synchronised, case.connected, case.draining, case.leases) == case.expect


@pytest.mark.parametrize(
    ("env", "expect"),
    [
        ({}, "http://127.0.0.1:8788/healthz"),
        ({"GATEWAY_DATAPLANE_LISTEN": "127.0.0.1:9200"}, "http://127.0.0.1:9200/healthz"),
        ({"GATEWAY_DATAPLANE_LISTEN": "0.0.0.0:9200"}, "http://127.0.0.1:9200/healthz"),
        ({"GATEWAY_DATAPLANE_LISTEN": "[::]:9200"}, "http://[::1]:9200/healthz"),
        ({"GATEWAY_DATAPLANE_LISTEN": ""}, "http://127.0.0.1:8788/healthz"),
    ],
    ids=["default", "set", "every v4 interface", "every v6 interface", "blank"],
)
def test_probe_url(env: dict[str, str], expect: str) -> None:
    assert healthz_url(env) == expect


def test_probe_refuses_a_malformed_listen_address() -> None:
    with pytest.raises(ValueError):
        healthz_url({"GATEWAY_DATAPLANE_LISTEN": "8788"})
