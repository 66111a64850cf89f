"""GATEWAY_* environment → one frozen `Settings`.

This is the only module that reads configuration. Every problem is collected and reported at
once, each naming its variable, so an operator fixes a bad env file in one pass. It also reads
the standard `OTEL_*` variables of trace export (SPEC §21, `traces_of`). Credential
*values* are not settings: the registry holds credential variable *names* and each daemon reads
the value from its own environment when it needs it.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, parse_qsl, urlsplit

import msgspec

from shared.bounds import TTL_MAX_S, TTL_MIN_S
from shared.codes import Condition
from shared.otelsettings import SAMPLERS, TraceSettings, traces_of  # noqa: F401 (SPEC §21: re-exported)

if TYPE_CHECKING:  # shared.fleet loads only in fleet mode (tests/unit/test_lazy_imports.py)
    from shared.fleet.secret import FleetSecret

PREFIX = "GATEWAY_"
# Fleet mode (SPEC §16): a fleet id is a Redis key namespace; a host id names a pair in it.
FLEET_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
HOST_ID_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,62}$")
REDIS_SCHEMES = ("redis", "rediss", "unix")
# SPEC §19: the only query options a fleet Redis URL may carry (the timeouts and TLS checks are
# Leasehold's own; redis-py would otherwise merge any query option into its client's settings).
REDIS_QUERY_OPTIONS = {
    "redis": frozenset(),
    "unix": frozenset({"db"}),
    "rediss": frozenset({"ssl_ca_certs", "ssl_certfile", "ssl_keyfile"}),
}


class SettingsError(Exception):
    """Startup configuration is wrong; `problems` names every bad variable."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid configuration:\n  " + "\n  ".join(problems))
        self.problems = problems


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    state_dir: str
    runtime_dir: str
    rpc_socket: str
    control_host: str
    control_port: int
    dataplane_host: str
    dataplane_port: int
    dataplane_url: str
    control_url: str
    control_token: str | None
    mint_token: str | None
    read_token: str | None
    anthropic_base_url: str
    zai_base_url: str
    openai_base_url: str
    accounts_file: str | None
    max_fallback_hops: int
    fallback_on: tuple[Condition, ...]
    key_ttl_seconds: int
    max_body_bytes: int
    drain_seconds: float
    upstream_connect_timeout: float
    upstream_headers_timeout: float
    upstream_idle_timeout: float
    upstream_pool_size: int
    upstream_pool_timeout: float
    metrics_public: bool
    circuit_cooldown_seconds: int
    log_level: str
    prices_file: str | None = None
    ledger_retention_days: int = 90
    fleet_redis_url: str | None = None  # None: embedded (no fleet); may hold a password
    fleet_id: str = "leasehold"
    host_id: str = "localhost"
    fleet_host_ttl_seconds: int = 10
    traces: TraceSettings | None = None  # SPEC §21: None unless an OTLP endpoint is set
    # the data plane's connection bounds (SPEC §19)
    header_timeout_seconds: float = 10
    keepalive_seconds: float = 75
    max_connections: int = 4096
    client_stall_seconds: float = 60
    fleet_secret_file: str | None = None  # SPEC §19: required in fleet mode (control)
    fleet_secret: FleetSecret | None = None  # its bytes; repr never shows them
    fleet_verify_secret_file: str | None = None  # a rotation's other secret: accepted, never used to MAC
    fleet_verify_secret: FleetSecret | None = None


# Variables this module understands; anything else under GATEWAY_ is a credential name the
# accounts file may declare, so it is not refused here.
KNOWN = frozenset(
    PREFIX + n
    for n in (
        "STATE_DIR RUNTIME_DIR RPC_SOCKET CONTROL_LISTEN DATAPLANE_LISTEN DATAPLANE_URL "
        "CONTROL_URL CONTROL_TOKEN MINT_TOKEN READ_TOKEN ANTHROPIC_BASE_URL ANTHROPIC_API_KEY "
        "ZAI_BASE_URL ZAI_API_KEY OPENAI_BASE_URL OPENAI_API_KEY ACCOUNTS_FILE "
        "MAX_FALLBACK_HOPS FALLBACK_ON KEY_TTL_SECONDS MAX_BODY_BYTES DRAIN_SECONDS "
        "UPSTREAM_CONNECT_TIMEOUT UPSTREAM_HEADERS_TIMEOUT UPSTREAM_IDLE_TIMEOUT "
        "UPSTREAM_POOL_SIZE UPSTREAM_POOL_TIMEOUT "
        "METRICS_PUBLIC CIRCUIT_COOLDOWN_SECONDS LOG_LEVEL PRICES_FILE LEDGER_RETENTION_DAYS "
        "FLEET_REDIS_URL FLEET_ID HOST_ID FLEET_HOST_TTL_SECONDS FLEET_SECRET_FILE FLEET_VERIFY_SECRET_FILE "
        "HEADER_TIMEOUT_SECONDS KEEPALIVE_SECONDS MAX_CONNECTIONS CLIENT_STALL_SECONDS"
    ).split()
)


class _Reader:
    """Reads variables, remembering every problem instead of stopping at the first."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.problems: list[str] = []

    def text(self, name: str, default: str | None) -> str | None:
        value = self.env.get(PREFIX + name)
        if value is None or value.strip() == "":
            return default
        return value.strip()

    def number(self, name: str, default: float, lo: float, hi: float, *, integer: bool) -> float:
        raw = self.text(name, None)
        if raw is None:
            return default
        try:
            value = int(raw) if integer else float(raw)
        except ValueError:
            kind = "an integer" if integer else "a number"
            self.problems.append(f"{PREFIX}{name}={raw!r} is not {kind}")
            return default
        if not lo <= value <= hi:
            self.problems.append(f"{PREFIX}{name}={raw} is outside {lo:g}..{hi:g}")
            return default
        return value

    def flag(self, name: str) -> bool:
        raw = self.text(name, "0")
        if raw not in ("0", "1"):
            self.problems.append(f"{PREFIX}{name}={raw!r} must be 0 or 1")
            return False
        return raw == "1"

    def listen(self, name: str, default: str) -> tuple[str, int]:
        raw = self.text(name, default) or default
        host, sep, port = raw.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            self.problems.append(f"{PREFIX}{name}={raw!r} must be HOST:PORT")
            host, port = default.rsplit(":", 1)
        return host.strip("[]"), int(port)

    def url(self, name: str, default: str) -> str:
        raw = self.text(name, default) or default
        parts = urlsplit(raw)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            self.problems.append(f"{PREFIX}{name}={raw!r} must be an http(s) URL")
            return default
        return raw.rstrip("/")

    def redis_url(self, name: str) -> str | None:
        """A fleet Redis URL, or None. A bad one is named but never echoed: it may hold a password."""
        raw = self.text(name, None)
        if raw is None:
            return None
        try:
            parts = urlsplit(raw)
            port_ok = parts.scheme == "unix" or parts.port is None or parts.port > 0
        except ValueError:
            parts, port_ok = None, False
        if parts is None or parts.scheme not in REDIS_SCHEMES or not port_ok:
            self.problems.append(f"{PREFIX}{name} must be a redis://, rediss:// or unix:// URL")
            return None
        try:  # SPEC §19: the URL may not loosen the client (a timeout, ssl_cert_reqs=none, ...)
            query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
        except ValueError:
            query = [("", "")]
        allowed = REDIS_QUERY_OPTIONS[parts.scheme]
        options = [key for key, _value in query]
        if any(key not in allowed for key in options) or len(set(options)) != len(options):
            shown = ", ".join(sorted(allowed)) or "none"
            self.problems.append(
                f"{PREFIX}{name} accepts only these query options for {parts.scheme}://: {shown} (each at most once)"
            )
            return None
        if parts.scheme == "unix":
            db = parse_qs(parts.query).get("db", ["0"])[0]
            where_ok = parts.path.startswith("/")
        else:
            db = parts.path.strip("/") or "0"
            where_ok = bool(parts.hostname)
        if not where_ok or not db.isdigit():
            self.problems.append(f"{PREFIX}{name} must name a host (or a socket path) and a numeric database")
            return None
        return raw

    def secret_file(self, name: str, *, required: bool) -> tuple[str | None, FleetSecret | None]:
        """The fleet secret file (SPEC §19): its path and its exact bytes, or a problem naming it."""
        path = self.text(name, None)
        if path is None:
            if required:
                self.problems.append(
                    f"{PREFIX}{name} is required in fleet mode (a file of at least 32 "
                    "random bytes, mode 0400 or 0600, the same on every host)"
                )
            return None, None
        from shared.fleet.secret import read_secret_file  # fleet mode only

        secret, problem = read_secret_file(path, PREFIX + name)
        if problem is not None:
            self.problems.append(problem)
        return path, secret

    def identifier(self, name: str, default: str, pattern: re.Pattern[str]) -> str:
        raw = self.text(name, default) or default
        if not pattern.match(raw):
            self.problems.append(f"{PREFIX}{name}={raw!r} must match {pattern.pattern}")
            return default
        return raw

    def conditions(self, name: str) -> tuple[Condition, ...]:
        raw = self.text(name, None)
        if raw is None:
            return tuple(Condition)
        chosen: list[Condition] = []
        for item in (part.strip() for part in raw.split(",")):
            if not item:
                continue
            try:
                chosen.append(Condition(item))
            except ValueError:
                allowed = ", ".join(Condition)
                self.problems.append(f"{PREFIX}{name}: unknown condition {item!r} (known: {allowed})")
        return tuple(c for c in Condition if c in chosen)


def load_settings(
    env: Mapping[str, str] | None = None, *, role: str = "control", hostname: str | None = None
) -> Settings:
    """Read every GATEWAY_* variable; raise `SettingsError` naming each bad one.

    `role` is "control" (needs the control token) or "dataplane" / "ctl" (do not). `hostname`
    (default: this machine's) is what `GATEWAY_HOST_ID` defaults to, sanitised.
    """
    r = _Reader(os.environ if env is None else env)
    state_dir = r.text("STATE_DIR", "/var/lib/leasehold")
    runtime_dir = r.text("RUNTIME_DIR", "/run/leasehold")
    control_host, control_port = r.listen("CONTROL_LISTEN", "127.0.0.1:8789")
    dp_host, dp_port = r.listen("DATAPLANE_LISTEN", "127.0.0.1:8788")
    control_token = r.text("CONTROL_TOKEN", None)
    if role == "control" and control_token is None:
        r.problems.append(f"{PREFIX}CONTROL_TOKEN is required (the admin bearer token)")
    settings = Settings(
        state_dir=os.path.abspath(state_dir or "."),
        runtime_dir=os.path.abspath(runtime_dir or "."),
        rpc_socket=os.path.abspath(r.text("RPC_SOCKET", None) or os.path.join(runtime_dir or ".", "control.sock")),
        control_host=control_host,
        control_port=control_port,
        dataplane_host=dp_host,
        dataplane_port=dp_port,
        dataplane_url=r.url("DATAPLANE_URL", f"http://{_authority(dp_host, dp_port)}"),
        control_url=r.url("CONTROL_URL", f"http://{_authority(control_host, control_port)}"),
        control_token=control_token,
        mint_token=r.text("MINT_TOKEN", None),
        read_token=r.text("READ_TOKEN", None),
        anthropic_base_url=r.url("ANTHROPIC_BASE_URL", "https://api.anthropic.com"),
        zai_base_url=r.url("ZAI_BASE_URL", "https://api.z.ai/api/anthropic"),
        openai_base_url=r.url("OPENAI_BASE_URL", "https://api.openai.com"),
        accounts_file=r.text("ACCOUNTS_FILE", None),
        max_fallback_hops=int(r.number("MAX_FALLBACK_HOPS", 1, 0, 16, integer=True)),
        fallback_on=r.conditions("FALLBACK_ON"),
        key_ttl_seconds=int(r.number("KEY_TTL_SECONDS", 3600, TTL_MIN_S, TTL_MAX_S, integer=True)),
        max_body_bytes=int(r.number("MAX_BODY_BYTES", 33554432, 1024, 1 << 31, integer=True)),
        drain_seconds=r.number("DRAIN_SECONDS", 30, 0, 3600, integer=False),
        upstream_connect_timeout=r.number("UPSTREAM_CONNECT_TIMEOUT", 10, 0.1, 600, integer=False),
        upstream_headers_timeout=r.number("UPSTREAM_HEADERS_TIMEOUT", 600, 0.1, 7200, integer=False),
        upstream_idle_timeout=r.number("UPSTREAM_IDLE_TIMEOUT", 300, 0.1, 7200, integer=False),
        upstream_pool_size=int(r.number("UPSTREAM_POOL_SIZE", 1024, 1, 65536, integer=True)),
        upstream_pool_timeout=r.number("UPSTREAM_POOL_TIMEOUT", 10, 0.01, 600, integer=False),
        metrics_public=r.flag("METRICS_PUBLIC"),
        circuit_cooldown_seconds=int(r.number("CIRCUIT_COOLDOWN_SECONDS", 30, 1, 900, integer=True)),
        log_level=(r.text("LOG_LEVEL", "info") or "info").lower(),
        prices_file=r.text("PRICES_FILE", None),
        ledger_retention_days=int(r.number("LEDGER_RETENTION_DAYS", 90, 1, 3650, integer=True)),
        fleet_redis_url=r.redis_url("FLEET_REDIS_URL"),
        fleet_id=r.identifier("FLEET_ID", "leasehold", FLEET_ID_RE),
        host_id=r.identifier("HOST_ID", host_id_of(socket.gethostname() if hostname is None else hostname), HOST_ID_RE),
        fleet_host_ttl_seconds=int(r.number("FLEET_HOST_TTL_SECONDS", 10, 3, 120, integer=True)),
        traces=traces_of(r.env, r.problems),
        **_connection_bounds(r),
    )
    settings = _with_fleet_secret(settings, r, role)
    r.problems += _cross_checks(settings)
    if r.problems:
        raise SettingsError(r.problems)
    return settings


def _with_fleet_secret(settings: Settings, r: _Reader, role: str) -> Settings:
    """SPEC §19: in fleet mode the fleet secret file, required by both daemons (control seals
    what it publishes; the data plane believes only sealed heartbeats, so a Redis writer cannot
    lift its lapse); leaseholdctl never reads it."""
    if settings.fleet_redis_url is None or role == "ctl":
        return settings
    secret_file, secret = r.secret_file("FLEET_SECRET_FILE", required=True)
    verify_file, verify_secret = r.secret_file("FLEET_VERIFY_SECRET_FILE", required=False)
    if verify_file is not None and secret_file is None:
        r.problems.append(
            f"{PREFIX}FLEET_VERIFY_SECRET_FILE is set without {PREFIX}FLEET_SECRET_FILE "
            "(it is the other secret of a rotation, accepted beside the fleet secret)"
        )
    return msgspec.structs.replace(
        settings,
        fleet_secret_file=secret_file,
        fleet_secret=secret,
        fleet_verify_secret_file=verify_file,
        fleet_verify_secret=verify_secret,
    )


def _connection_bounds(r: _Reader) -> dict[str, Any]:
    """The data plane's connection bounds (SPEC §19): all four 1..3600 s but the cap."""
    return {
        "header_timeout_seconds": r.number("HEADER_TIMEOUT_SECONDS", 10, 1, 3600, integer=False),
        "keepalive_seconds": r.number("KEEPALIVE_SECONDS", 75, 1, 3600, integer=False),
        "max_connections": int(r.number("MAX_CONNECTIONS", 4096, 16, 1_000_000, integer=True)),
        "client_stall_seconds": r.number("CLIENT_STALL_SECONDS", 60, 1, 3600, integer=False),
    }


def _cross_checks(settings: Settings) -> list[str]:
    """What no one variable's parse can see: the log level's vocabulary, three distinct tokens."""
    problems = []
    if settings.log_level not in ("debug", "info", "warning", "error"):
        problems.append(f"{PREFIX}LOG_LEVEL={settings.log_level!r} must be debug|info|warning|error")
    tokens = [t for t in (settings.control_token, settings.mint_token, settings.read_token) if t]
    if len(set(tokens)) != len(tokens):
        problems.append(f"{PREFIX}CONTROL_TOKEN, {PREFIX}MINT_TOKEN and {PREFIX}READ_TOKEN must differ")
    return problems


def unknown_variables(env: Mapping[str, str]) -> list[str]:
    """GATEWAY_* names this module does not know (credential names, or typos): for a warning."""
    return sorted(k for k in env if k.startswith(PREFIX) and k not in KNOWN)


def host_id_of(hostname: str) -> str:
    """A host name as a host id: lowercased, every other character a `-`, within 63 characters,
    starting with a letter or digit (`localhost` when nothing is left)."""
    cleaned = re.sub(r"[^a-z0-9.-]", "-", hostname.strip().lower())
    cleaned = re.sub(r"^[^a-z0-9]+", "", cleaned)[:63]
    return cleaned if HOST_ID_RE.match(cleaned) else "localhost"


def _authority(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"[{shown}]:{port}" if ":" in shown else f"{shown}:{port}"
