"""The fleet's key layout and encodings, by tables and properties (no Redis needed)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from controlplane.core import circuit as rules
from controlplane.fleet.circuits import encode_circuit
from shared.codes import CircuitPhase, Condition
from shared.fleet.keys import Ceiling, FleetKeys
from shared.fleet.redis_client import connect, describe
from shared.logging import redact_text


def every_key(keys: FleetKeys) -> list[str]:
    return [
        keys.incarnation,
        keys.hosts_seen,
        keys.hosts_instance,
        keys.hosts_epoch,
        keys.host_in_flight("h"),
        keys.registered,
        keys.events,
        keys.revoke,
        keys.headroom,
        keys.revoke_acked,
        keys.revoke_acks("rv-1"),
        keys.circuit("a"),
        keys.decision("md_1"),
        keys.refused("md_1"),
        keys.decision_of_key("K"),
        keys.evidence("md_1"),
        keys.live("r", "d"),
        keys.live_of_key("K"),
        *(keys.chain("policy", p) for p in ("records", "anchor", "rev", "lock", "seeded")),
        *(f(t) for t in Ceiling for f in (keys.cap_owner, keys.cap_hosts)),
        *(keys.cap_account(t, "a") for t in Ceiling),
        *(keys.cap_host(t, "h") for t in Ceiling),
    ]


def test_every_key_of_a_fleet_is_in_its_namespace_and_one_cluster_slot() -> None:
    keys = FleetKeys("team-b")
    names = every_key(keys)
    assert all(n.startswith("{team-b}:") for n in names)
    assert len(set(names)) == len(names)
    assert {key_slot(n.encode()) for n in names} == {key_slot(b"team-b")}


def test_two_fleets_never_share_a_key() -> None:
    assert not set(every_key(FleetKeys("a"))) & set(every_key(FleetKeys("b")))


LIVE_PAIRS = [("a:b", "c"), ("a", "b:c"), ("ab", "c"), ("a", "bc"), ("", "abc"), ("abc", "")]


def test_a_dispatchs_live_key_is_unambiguous_whatever_its_parts_hold() -> None:
    keys = FleetKeys("f")
    assert len({keys.live(repo, dispatch) for repo, dispatch in LIVE_PAIRS}) == len(LIVE_PAIRS)


@pytest.mark.parametrize("fleet_id", ["", "Upper", "has:colon", "{tag}", "a b", "-leading", "x" * 64])
def test_a_fleet_id_outside_the_namespace_charset_is_refused(fleet_id: str) -> None:
    with pytest.raises(ValueError):
        FleetKeys(fleet_id)


circuits = st.builds(
    rules.Circuit,
    phase=st.sampled_from(list(CircuitPhase)),
    consecutive=st.integers(0, 10),
    opened_at_ms=st.none() | st.integers(0, 2**45),
    retry_at_ms=st.none() | st.integers(0, 2**45),
    opened_by=st.none() | st.sampled_from(list(Condition)),
    open_ms=st.integers(0, 900_000),
    probe_key=st.none() | st.text(min_size=1, max_size=30),
)


@given(circuits)
def test_equal_circuits_encode_to_equal_bytes(state: rules.Circuit) -> None:
    """RedisCircuits compares bytes: the encoding must be canonical."""
    rebuilt = msgspec.structs.replace(state)  # an equal, distinct object
    decoded = msgspec.msgpack.decode(encode_circuit(state), type=rules.Circuit)
    assert rebuilt == state == decoded
    assert encode_circuit(rebuilt) == encode_circuit(state) == encode_circuit(decoded)


def test_a_redis_url_is_logged_without_its_password() -> None:
    url = "rediss://leasehold:s3cret-pass-word@redis.internal:6380/2"
    assert describe(url) == "rediss://redis.internal:6380/2"
    assert describe("unix:///run/redis/redis.sock?db=1&password=x") == "unix:///run/redis/redis.sock"
    connect(url)  # builds a pool, connects nothing; registers the password with the redactor
    assert "s3cret-pass-word" not in redact_text(f"connecting to {url}")
