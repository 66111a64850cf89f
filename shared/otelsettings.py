"""The standard `OTEL_*` variables of trace export (SPEC §21) → `TraceSettings`, or None.

Part of the settings module (`shared/settings.load_settings` calls `traces_of` with the
environment it reads; nothing here reads `os.environ`), split out to keep each module small.
Every value is handed to the OpenTelemetry SDK explicitly by control, never read by the SDK
from the environment itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

import msgspec

SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)


class TraceSettings(msgspec.Struct, frozen=True, kw_only=True):
    """SPEC §21's export, from the standard `OTEL_*` variables, handed to the SDK explicitly
    (`controlplane/traces.py` never lets the SDK read the environment itself)."""

    endpoint: str  # the full OTLP/HTTP traces URL (…/v1/traces)
    headers: tuple[tuple[str, str], ...] = ()  # may hold a collector's API key: never logged
    timeout_s: float = 10.0
    compression: str = "none"  # none | gzip
    certificate_file: str | None = None
    client_key_file: str | None = None
    client_certificate_file: str | None = None
    service_name: str = "leasehold"  # OTEL_SERVICE_NAME, else the resource's, else leasehold
    resource: tuple[tuple[str, str], ...] = ()  # OTEL_RESOURCE_ATTRIBUTES
    bsp_schedule_delay_ms: int = 5000
    bsp_max_queue_size: int = 2048
    bsp_max_export_batch_size: int = 512
    bsp_export_timeout_ms: int = 30000
    sampler: str = "parentbased_always_on"  # OTEL_TRACES_SAMPLER (shared/spans.SAMPLERS)
    sampler_ratio: float = 1.0  # OTEL_TRACES_SAMPLER_ARG, for the *traceidratio ones


def _otel(env: Mapping[str, str], name: str) -> str | None:
    """`OTEL_EXPORTER_OTLP_TRACES_{name}`, else `OTEL_EXPORTER_OTLP_{name}` (the signal-specific
    variable wins, as the OpenTelemetry specification says), blank as unset."""
    for variable in (f"OTEL_EXPORTER_OTLP_TRACES_{name}", f"OTEL_EXPORTER_OTLP_{name}"):
        value = env.get(variable, "").strip()
        if value:
            return value
    return None


def _otel_variable(env: Mapping[str, str], name: str) -> str:
    """The variable `_otel(env, name)` reads: the signal-specific one when it is set (so a
    problem names the variable the operator actually wrote)."""
    signal = f"OTEL_EXPORTER_OTLP_TRACES_{name}"
    return signal if env.get(signal, "").strip() else f"OTEL_EXPORTER_OTLP_{name}"


def _service_name(env: Mapping[str, str], resource: tuple[tuple[str, str], ...]) -> str:
    """`OTEL_SERVICE_NAME`, else a `service.name` in `OTEL_RESOURCE_ATTRIBUTES`, else
    `leasehold`: the OpenTelemetry specification's precedence."""
    named = env.get("OTEL_SERVICE_NAME", "").strip()
    if named:
        return named
    given = [value for key, value in resource if key == "service.name" and value]
    return given[-1] if given else "leasehold"


def _otel_pairs(raw: str | None, variable: str, problems: list[str], *, secret: bool) -> tuple[tuple[str, str], ...]:
    """`k=v,k2=v2` (values URL-decoded, the specification's format for headers and resource
    attributes). A malformed one is named; a header's value (a collector key) is never echoed."""
    pairs: list[tuple[str, str]] = []
    for item in (raw or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            problems.append(
                f"{variable} must be key=value pairs separated by commas"
                + ("" if secret else f" (got {item.strip()!r})")
            )
            return ()
        pairs.append((unquote(key.strip()), unquote(value.strip())))
    return tuple(pairs)


def _otel_int(env: Mapping[str, str], variable: str, default: int, lo: int, problems: list[str]) -> int:
    raw = env.get(variable, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < lo:
        problems.append(f"{variable}={raw!r} must be an integer of at least {lo}")
        return default
    return int(raw)


def traces_of(env: Mapping[str, str], problems: list[str]) -> TraceSettings | None:
    """SPEC §21: the `OTEL_*` variables → `TraceSettings`, or None (no export) when no OTLP
    endpoint is set, `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`."""
    exporter = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if exporter not in ("otlp", "none"):
        problems.append(f"OTEL_TRACES_EXPORTER={exporter!r}: only otlp (or none) is supported")
    signal_url = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    base_url = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if (
        (not signal_url and not base_url)
        or exporter != "otlp"
        or env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    ):
        return None
    endpoint = signal_url or base_url.rstrip("/") + "/v1/traces"  # the generic one is a base URL
    variable = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" if signal_url else "OTEL_EXPORTER_OTLP_ENDPOINT"
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        problems.append(f"{variable} must be an http(s) URL")
    protocol = _otel(env, "PROTOCOL") or "http/protobuf"
    if protocol != "http/protobuf":
        problems.append(f"{_otel_variable(env, 'PROTOCOL')}={protocol!r}: only http/protobuf is supported")
    compression = (_otel(env, "COMPRESSION") or "none").lower()
    if compression not in ("none", "gzip"):
        problems.append(f"{_otel_variable(env, 'COMPRESSION')}={compression!r} must be none or gzip")
    timeout_ms = _otel(env, "TIMEOUT") or "10000"
    if not timeout_ms.isdigit() or not 1 <= int(timeout_ms) <= 600_000:
        problems.append(f"{_otel_variable(env, 'TIMEOUT')}={timeout_ms!r} must be milliseconds in 1..600000")
        timeout_ms = "10000"
    sampler = env.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_always_on"
    if sampler not in SAMPLERS:
        problems.append(f"OTEL_TRACES_SAMPLER={sampler!r} must be one of {', '.join(SAMPLERS)}")
        sampler = "parentbased_always_on"
    ratio_raw = env.get("OTEL_TRACES_SAMPLER_ARG", "").strip() or "1.0"
    try:
        ratio = float(ratio_raw)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        problems.append(f"OTEL_TRACES_SAMPLER_ARG={ratio_raw!r} must be a ratio in 0..1")
        ratio = 1.0
    resource = _otel_pairs(env.get("OTEL_RESOURCE_ATTRIBUTES"), "OTEL_RESOURCE_ATTRIBUTES", problems, secret=False)
    return TraceSettings(
        endpoint=endpoint,
        sampler=sampler,
        sampler_ratio=ratio,
        headers=_otel_pairs(_otel(env, "HEADERS"), _otel_variable(env, "HEADERS"), problems, secret=True),
        timeout_s=int(timeout_ms) / 1000,
        compression=compression,
        certificate_file=_otel(env, "CERTIFICATE"),
        client_key_file=_otel(env, "CLIENT_KEY"),
        client_certificate_file=_otel(env, "CLIENT_CERTIFICATE"),
        service_name=_service_name(env, resource),
        resource=resource,
        bsp_schedule_delay_ms=_otel_int(env, "OTEL_BSP_SCHEDULE_DELAY", 5000, 1, problems),
        bsp_max_queue_size=_otel_int(env, "OTEL_BSP_MAX_QUEUE_SIZE", 2048, 1, problems),
        bsp_max_export_batch_size=_otel_int(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512, 1, problems),
        bsp_export_timeout_ms=_otel_int(env, "OTEL_BSP_EXPORT_TIMEOUT", 30000, 1, problems),
    )
