"""The shared contract by tables: codes, settings, tokens, scrub (condition_for_terminal:
`test_evidence.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.codes import HTTP_STATUS, AttemptStatus, Condition, ErrorCode, Refusal
from shared.envscrub import scrub_spawn_env
from shared.settings import SettingsError, load_settings
from shared.tokens import digest, format_token, parse_key_id, ulid

BASE = {"GATEWAY_CONTROL_TOKEN": "control-token-value"}


def test_every_refusal_has_an_http_status() -> None:
    assert set(HTTP_STATUS) == set(Refusal) | set(ErrorCode)


def test_a_refusal_and_an_error_never_share_a_spelling() -> None:
    assert not {str(r) for r in Refusal} & {str(e) for e in ErrorCode}
    assert ErrorCode.UPSTREAM_TIMEOUT.value == "upstream-timeout" and "UPSTREAM_TIMEOUT" not in Refusal.__members__


def test_codes_are_kebab_case_wire_strings() -> None:
    for enum in (Refusal, ErrorCode, Condition, AttemptStatus):
        for member in enum:
            assert member.value == member.value.lower() and " " not in member.value and "_" not in member.value


SETTINGS_ERRORS = [
    ("GATEWAY_MAX_FALLBACK_HOPS", "two"),
    ("GATEWAY_KEY_TTL_SECONDS", "59"),
    ("GATEWAY_KEY_TTL_SECONDS", "86401"),
    ("GATEWAY_CIRCUIT_COOLDOWN_SECONDS", "901"),
    ("GATEWAY_FALLBACK_ON", "rate-limited,bogus"),
    ("GATEWAY_METRICS_PUBLIC", "yes"),
    ("GATEWAY_CONTROL_LISTEN", "nope"),
    ("GATEWAY_ANTHROPIC_BASE_URL", "ftp://x"),
    ("GATEWAY_UPSTREAM_IDLE_TIMEOUT", "-1"),
    ("GATEWAY_LEDGER_RETENTION_DAYS", "0"),
    ("GATEWAY_LEDGER_RETENTION_DAYS", "3651"),
    ("GATEWAY_LEDGER_RETENTION_DAYS", "a week"),
    ("GATEWAY_FLEET_REDIS_URL", "http://127.0.0.1:6379"),
    ("GATEWAY_FLEET_REDIS_URL", "redis://127.0.0.1:6379/zero"),
    ("GATEWAY_FLEET_REDIS_URL", "redis://127.0.0.1:70000/0"),
    ("GATEWAY_FLEET_REDIS_URL", "unix://relative.sock"),
    ("GATEWAY_FLEET_ID", "Fleet{1}"),
    ("GATEWAY_FLEET_ID", "a" * 64),
    ("GATEWAY_HOST_ID", "Host_A"),
    ("GATEWAY_HOST_ID", "-leading"),
    ("GATEWAY_FLEET_HOST_TTL_SECONDS", "2"),
    ("GATEWAY_FLEET_HOST_TTL_SECONDS", "121"),
]


@pytest.mark.parametrize("name,value", SETTINGS_ERRORS, ids=[f"{n}={v}" for n, v in SETTINGS_ERRORS])
def test_bad_setting_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings({**BASE, name: value})
    assert any(name in problem for problem in caught.value.problems)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings({"GATEWAY_KEY_TTL_SECONDS": "1", "GATEWAY_MAX_BODY_BYTES": "x"})
    assert len(caught.value.problems) == 3  # two bad values and the missing control token


def test_defaults_match_the_spec() -> None:
    s = load_settings(BASE)
    assert (s.control_port, s.dataplane_port, s.max_fallback_hops, s.key_ttl_seconds) == (8789, 8788, 1, 3600)
    assert s.fallback_on == tuple(Condition)
    assert s.rpc_socket == "/run/leasehold/control.sock" and s.state_dir == "/var/lib/leasehold"
    assert (s.max_body_bytes, s.drain_seconds, s.circuit_cooldown_seconds) == (33554432, 30, 30)
    assert (s.upstream_connect_timeout, s.upstream_headers_timeout, s.upstream_idle_timeout) == (10, 600, 300)
    assert load_settings({**BASE, "GATEWAY_FALLBACK_ON": "rate-limited"}).fallback_on == (Condition.RATE_LIMITED,)
    assert (s.prices_file, s.ledger_retention_days) == (None, 90)
    bounded = [load_settings({**BASE, "GATEWAY_LEDGER_RETENTION_DAYS": v}).ledger_retention_days for v in ("1", "3650")]
    assert bounded == [1, 3650]
    assert (
        load_settings({**BASE, "GATEWAY_PRICES_FILE": "/etc/leasehold/prices.toml"}).prices_file
        == "/etc/leasehold/prices.toml"
    )


def test_fleet_defaults_are_embedded_with_the_host_name(tmp_path: Path) -> None:
    secret = tmp_path / "fleet-secret"
    secret.write_bytes(b"s" * 32)
    secret.chmod(0o600)
    s = load_settings(BASE, hostname="worker-7")
    assert (s.fleet_redis_url, s.fleet_id, s.host_id, s.fleet_host_ttl_seconds) == (None, "leasehold", "worker-7", 10)
    fleet = load_settings(
        {
            **BASE,
            "GATEWAY_FLEET_REDIS_URL": "rediss://:pw@redis.internal:6380/2",
            "GATEWAY_FLEET_ID": "team-b",
            "GATEWAY_HOST_ID": "gw-1.dc2",
            "GATEWAY_FLEET_HOST_TTL_SECONDS": "30",
            "GATEWAY_FLEET_SECRET_FILE": str(secret),
        },
        hostname="ignored",
    )
    assert (fleet.fleet_redis_url, fleet.fleet_id, fleet.host_id, fleet.fleet_host_ttl_seconds) == (
        "rediss://:pw@redis.internal:6380/2",
        "team-b",
        "gw-1.dc2",
        30,
    )
    assert load_settings(
        {**BASE, "GATEWAY_FLEET_REDIS_URL": "unix:///run/redis.sock?db=1", "GATEWAY_FLEET_SECRET_FILE": str(secret)}
    ).fleet_redis_url


HOST_NAMES = [
    ("plain", "worker-7", "worker-7"),
    ("upper case", "Web01.Example.COM", "web01.example.com"),
    ("underscores", "build_box_3", "build-box-3"),
    ("leading junk", "--_x", "x"),
    ("nothing usable", "___", "localhost"),
    ("too long", "h" * 80, "h" * 63),
    ("unicode", "bücher", "b-cher"),
]


@pytest.mark.parametrize("name,hostname,expected", HOST_NAMES, ids=[c[0] for c in HOST_NAMES])
def test_host_id_defaults_to_the_sanitised_host_name(name: str, hostname: str, expected: str) -> None:
    assert load_settings(BASE, hostname=hostname).host_id == expected


def test_a_bad_redis_url_is_named_but_never_echoed() -> None:
    """The URL may carry the Redis password: the problem names the variable, not the value."""
    with pytest.raises(SettingsError) as caught:
        load_settings({**BASE, "GATEWAY_FLEET_REDIS_URL": "http://:hunter2-secret@h:6379/0"})
    assert caught.value.problems and all("hunter2" not in p for p in caught.value.problems)


LOOSENING = [
    "redis://h:6379/0?socket_timeout=60",
    "rediss://:hunter2-secret@h:6380/0?ssl_cert_reqs=none",
    "rediss://h:6380/0?ssl_check_hostname=false",
    "redis://h:6379/0?password=hunter2-secret",
    "redis://h:6379/0?ssl_ca_certs=/ca.pem",
    "rediss://h/0?ssl_ca_certs=/a.pem&ssl_ca_certs=/b.pem",
    "unix:///run/r.sock?db=0&socket_connect_timeout=9",
    "redis://h:6379/0?health_check_interval",
    "rediss://h/0?ssl_ca_certs=/ca.pem&max_connections=1",
]


@pytest.mark.parametrize("url", LOOSENING)
def test_a_redis_url_option_that_could_loosen_the_client_refuses_startup(url: str) -> None:
    """SPEC §19: only ssl_ca_certs, ssl_certfile, ssl_keyfile (rediss://) and db (unix://) pass;
    the problem names the variable, never the URL (it may hold a password)."""
    with pytest.raises(SettingsError) as caught:
        load_settings({**BASE, "GATEWAY_FLEET_REDIS_URL": url}, role="dataplane")
    assert any("GATEWAY_FLEET_REDIS_URL" in p for p in caught.value.problems)
    assert all("hunter2" not in p and "socket_timeout=60" not in p for p in caught.value.problems)


def test_the_tls_files_pass(tmp_path: Path) -> None:
    url = "rediss://leasehold:pw@redis.internal:6380/0?ssl_ca_certs=/etc/ca.pem&ssl_certfile=/c.pem&ssl_keyfile=/k.pem"
    secret = tmp_path / "fleet-secret"
    secret.write_bytes(b"s" * 32)
    secret.chmod(0o600)
    env = {"GATEWAY_FLEET_REDIS_URL": url, "GATEWAY_FLEET_SECRET_FILE": str(secret)}
    assert load_settings(env, role="dataplane").fleet_redis_url == url


def test_dataplane_does_not_need_the_control_token() -> None:
    assert load_settings({}, role="dataplane").control_token is None


def test_token_format_round_trip() -> None:
    key_id = ulid(1_700_000_000_000, bytes(range(10)))
    assert len(key_id) == 26
    token = format_token(key_id, b"\x01" * 32)
    assert token.startswith("lhgw_" + key_id + ".") and "=" not in token
    assert parse_key_id(token) == key_id
    assert parse_key_id(token + "x") is None and parse_key_id("lhgw_" + key_id) is None
    assert len(digest(token)) == 32


def test_ulids_sort_by_time() -> None:
    assert ulid(1, bytes(10)) < ulid(2, bytes(10)) < ulid(2, b"\xff" * 10)


def test_scrub_removes_the_whole_gateway_namespace() -> None:
    env = {"GATEWAY_ANTHROPIC_API_KEY": "x", "GATEWAY_WHATEVER_KEY": "y", "PATH": "/bin", "HOME": "/h"}
    assert scrub_spawn_env(env) == {"PATH": "/bin", "HOME": "/h"}
