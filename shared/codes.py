"""Every closed vocabulary of Leasehold, spelled exactly as SPEC.md spells it.

A code is a `StrEnum` member, so it is its own wire string. Anything a refusal, skip, health
verdict or terminal row can say is a member here; nothing else may appear on the wire.
"""

from __future__ import annotations

from enum import StrEnum


class Wire(StrEnum):
    ANTHROPIC = "anthropic"
    OPENAI = "openai"


class Binding(StrEnum):
    ANTHROPIC = "anthropic"
    ZAI_HARNESS = "zai-harness"
    OPENAI = "openai"


WIRE_OF_BINDING: dict[Binding, Wire] = {
    Binding.ANTHROPIC: Wire.ANTHROPIC,
    Binding.ZAI_HARNESS: Wire.ANTHROPIC,
    Binding.OPENAI: Wire.OPENAI,
}


class AuthStyle(StrEnum):
    X_API_KEY = "x-api-key"
    BEARER = "bearer"


class Refusal(StrEnum):
    """Why the gateway itself refused something (mint, fallback, or a proxied request)."""

    # gateway-authored terminals of the data plane (SPEC §7, §14)
    REQUEST_CAPACITY_EXHAUSTED = "request-capacity-exhausted"
    CONTROL_UNAVAILABLE = "control-unavailable"
    POOL_TIMEOUT = "pool-timeout"
    BODY_TOO_LARGE = "body-too-large"
    PATH_NOT_SERVED = "path-not-served"
    GATEWAY_SHUTDOWN = "gateway-shutdown"
    OBSERVATION_STORAGE_UNAVAILABLE = "observation-storage-unavailable"
    MODEL_NOT_PERMITTED = "model-not-permitted"  # the lease's account does not serve it (§12)
    # hostile input (SPEC §19): a body not read strictly, a coding not decoded, too many connections
    INVALID_REQUEST_BODY = "invalid-request-body"
    UNSUPPORTED_CONTENT_ENCODING = "unsupported-content-encoding"
    CONNECTION_LIMIT = "connection-limit"
    # budgets (SPEC §18): a mint is held 503 `budget-exhausted`, a request refused 429 (the data
    # plane passes that status); a model without a price in a budgeted scope is refused 403
    BUDGET_EXHAUSTED = "budget-exhausted"
    MODEL_UNPRICED = "model-unpriced"
    # authentication and input (no row: refused before an authenticated lease)
    UNKNOWN_KEY = "unknown-key"
    ACCOUNT_NOT_CONFIGURED = "account-not-configured"
    WEBSOCKET_NOT_SUPPORTED = "websocket-not-supported"
    INTERNAL_ERROR = "internal-error"
    DATAPLANE_LOST = "dataplane-lost"
    # mint and fallback (SPEC §5, §6, §8)
    NO_ELIGIBLE_ACCOUNT = "no-eligible-account"
    FALLBACK_POOL_EXHAUSTED = "fallback-pool-exhausted"
    ACCOUNT_STATE_UNAVAILABLE = "account-state-unavailable"
    POLICY_UNAVAILABLE = "policy-unavailable"
    FALLBACK_LINEAGE_UNKNOWN = "fallback-lineage-unknown"
    FALLBACK_CITED_DECISION_NOT_SELECTED = "fallback-cited-decision-not-selected"
    FALLBACK_LINEAGE_MISMATCH = "fallback-lineage-mismatch"
    FALLBACK_RESPONSE_WAS_NOT_LOST = "fallback-response-was-not-lost"
    FALLBACK_LEASE_STILL_HELD = "fallback-lease-still-held"
    FALLBACK_NOT_AUTHORISED = "fallback-not-authorised"
    FALLBACK_BUDGET_EXHAUSTED = "fallback-budget-exhausted"
    MODEL_NOT_SERVED = "model-not-served"
    # renewal and extend of a key whose account the operator disabled or is draining (SPEC §19)
    ADMINISTRATIVE_DISABLED = "administrative-disabled"
    ADMINISTRATIVE_DRAINING = "administrative-draining"
    # dispatch keys (SPEC §17)
    FALLBACK_PENDING = "fallback-pending"
    # fleet mode (SPEC §16): the fleet's Redis cannot be reached or answers an error
    FLEET_STATE_UNAVAILABLE = "fleet-state-unavailable"


class ErrorCode(StrEnum):
    """An error the gateway answers with that is not a refusal: the caller's input or scope,
    a missing thing, a lost write race, or the upstream failing (`upstream-timeout` is the
    upstream's fault, reported, never a refusal). Spelled on the wire like every code."""

    UPSTREAM_TIMEOUT = "upstream-timeout"
    UPSTREAM_UNREACHABLE = "upstream-unreachable"
    UPSTREAM_PROTOCOL_ERROR = "upstream-protocol-error"
    UNAUTHENTICATED = "unauthenticated"
    FORBIDDEN_SCOPE = "forbidden-scope"
    NOT_FOUND = "not-found"
    REVISION_CONFLICT = "revision-conflict"
    DECISION_UNKNOWN = "decision-unknown"
    INVALID_REQUEST = "invalid-request"
    NOT_A_DISPATCH_KEY = "not-a-dispatch-key"


# The HTTP status each code answers with (a refusal, or another error). A test keeps it total.
HTTP_STATUS: dict[Refusal | ErrorCode, int] = {
    Refusal.REQUEST_CAPACITY_EXHAUSTED: 429,
    Refusal.CONTROL_UNAVAILABLE: 503,
    Refusal.POOL_TIMEOUT: 503,
    Refusal.BODY_TOO_LARGE: 413,
    Refusal.PATH_NOT_SERVED: 404,
    Refusal.GATEWAY_SHUTDOWN: 503,
    Refusal.OBSERVATION_STORAGE_UNAVAILABLE: 503,
    Refusal.MODEL_NOT_PERMITTED: 400,
    Refusal.INVALID_REQUEST_BODY: 400,
    Refusal.UNSUPPORTED_CONTENT_ENCODING: 415,
    Refusal.CONNECTION_LIMIT: 503,
    Refusal.BUDGET_EXHAUSTED: 503,  # at the mint; a request on a lease is refused 429 (§18)
    Refusal.MODEL_UNPRICED: 403,
    Refusal.UNKNOWN_KEY: 401,
    Refusal.ACCOUNT_NOT_CONFIGURED: 422,
    Refusal.WEBSOCKET_NOT_SUPPORTED: 426,
    Refusal.INTERNAL_ERROR: 500,
    Refusal.DATAPLANE_LOST: 503,
    Refusal.NO_ELIGIBLE_ACCOUNT: 503,
    Refusal.FALLBACK_POOL_EXHAUSTED: 409,
    Refusal.ACCOUNT_STATE_UNAVAILABLE: 503,
    Refusal.POLICY_UNAVAILABLE: 503,
    Refusal.FALLBACK_LINEAGE_UNKNOWN: 503,
    Refusal.FALLBACK_CITED_DECISION_NOT_SELECTED: 409,
    Refusal.FALLBACK_LINEAGE_MISMATCH: 409,
    Refusal.FALLBACK_RESPONSE_WAS_NOT_LOST: 409,
    Refusal.FALLBACK_LEASE_STILL_HELD: 503,
    Refusal.FALLBACK_NOT_AUTHORISED: 503,
    Refusal.FALLBACK_BUDGET_EXHAUSTED: 503,
    Refusal.MODEL_NOT_SERVED: 409,
    Refusal.ADMINISTRATIVE_DISABLED: 409,
    Refusal.ADMINISTRATIVE_DRAINING: 409,
    Refusal.FALLBACK_PENDING: 503,
    Refusal.FLEET_STATE_UNAVAILABLE: 503,
    ErrorCode.UPSTREAM_TIMEOUT: 504,
    ErrorCode.UPSTREAM_UNREACHABLE: 502,
    ErrorCode.UPSTREAM_PROTOCOL_ERROR: 502,
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.FORBIDDEN_SCOPE: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.REVISION_CONFLICT: 409,
    ErrorCode.DECISION_UNKNOWN: 404,
    ErrorCode.INVALID_REQUEST: 422,
    ErrorCode.NOT_A_DISPATCH_KEY: 409,
}


class Skip(StrEnum):
    """Why selection passed over a candidate (SPEC §6, in filter order)."""

    NOT_CONFIGURED = "not-configured"
    ADMINISTRATIVE_DISABLED = "administrative-disabled"
    ADMINISTRATIVE_DRAINING = "administrative-draining"
    CIRCUIT_OPEN = "circuit-open"
    LEASE_CAPACITY_EXHAUSTED = "lease-capacity-exhausted"
    RATE_LIMIT_HEADROOM_LOW = "rate-limit-headroom-low"  # only with min_headroom_percent set (§22)


class Condition(StrEnum):
    """A qualifying failure condition of an upstream answer (SPEC §7)."""

    RATE_LIMITED = "rate-limited"
    OVERLOADED = "overloaded"
    CREDIT_EXHAUSTED = "credit-exhausted"
    UPSTREAM_UNAVAILABLE = "upstream-unavailable"
    CREDENTIAL_REJECTED = "credential-rejected"
    TRANSPORT_ERROR = "transport-error"


class AttemptStatus(StrEnum):
    COMPLETED = "completed"
    UPSTREAM_ERROR = "upstream-error"
    CLIENT_ABORTED = "client-aborted"
    TRANSPORT_ERROR = "transport-error"
    REFUSED = "refused"


class Health(StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNVERIFIED = "unverified"


class HealthReason(StrEnum):
    NO_EVIDENCE = "no-evidence"
    CREDENTIAL_MISSING = "credential-missing"
    ONLY_ABORTED_EVIDENCE = "only-aborted-evidence"
    QUALIFYING_FAILURES = "qualifying-failures"
    WITHIN_THRESHOLD = "within-threshold"


class CostReason(StrEnum):
    PRICED = "priced"
    UNPRICED = "unpriced"
    NO_USAGE = "no-usage"
    NOT_BILLED = "not-billed"  # count_tokens, /v1/models: $0, never unpriced (SPEC §19)


class Scope(StrEnum):
    ADMIN = "admin"
    MINT = "mint"
    READ = "read"


class AdminState(StrEnum):
    ENABLED = "enabled"
    DRAINING = "draining"
    DISABLED = "disabled"


class CircuitPhase(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


class Outcome(StrEnum):
    SELECTED = "selected"
    REJECTED = "rejected"
    HELD = "held"


class EndReason(StrEnum):
    """Why a key ended, as `lease_ended` logs it: every path through the release seam."""

    REVOKED = "revoked"
    EXPIRED = "expired"
    ACCOUNT_REVOKED = "account-revoked"
    RENEWED = "renewed"
    RESERVATION_FAILED = "reservation-failed"
    HOPPED = "hopped"  # a dispatch key's lease replaced by the gateway (SPEC §17)
    # fleet mode (SPEC §16): a host's own standing ended the key
    HOST_REAPED = "host-reaped"  # this host was declared dead meanwhile: its slot was released
    # after Redis lost its data (or this host was away): the ceiling was full, or another host
    # holds the dispatch's one live lease now
    REREGISTRATION_REFUSED = "reregistration-refused"
    HOST_SUPERSEDED = "host-superseded"  # another instance holds this host id now: fail closed


class Standing(StrEnum):
    """A fleet host's standing, as its heartbeat finds it (SPEC §16)."""

    LIVE = "live"
    REAPED = "reaped"  # declared dead meanwhile: its holders were released
    SUPERSEDED = "superseded"  # another instance holds the host id now
    STATE_LOST = "state-lost"  # Redis lost the fleet's data (the incarnation changed)


class FleetMode(StrEnum):
    """Where the shared state lives (`fleet.mode` of the accounts view)."""

    EMBEDDED = "embedded"  # in this process (no GATEWAY_FLEET_REDIS_URL)
    REDIS = "redis"


class FleetState(StrEnum):
    """`fleet.state` of the accounts view: may this host rely on the shared state now?"""

    AVAILABLE = "available"
    UNAVAILABLE = "unavailable"
