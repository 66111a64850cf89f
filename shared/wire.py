"""msgspec Structs that cross a process boundary: RPC messages and the attempt row.

Every RPC message is a frozen Struct tagged by `op`, so one `Decoder(Message)` decodes any
frame. New fields get defaults and are appended; existing fields are never reordered or
renamed (golden frames in `tests/data/` hold the encoding still). No message carries a
credential, a token or a token's secret half: leases travel as sha256 digests, accounts name
the *variable* that holds their credential.
"""

from __future__ import annotations

import msgspec

# 2: `LeaseGates` (budgets, SPEC §18), which a version-1 data plane could not decode.
# 3: `SocketsOpen`, `ConnectionCounts`, `FleetLoops`, `Acks`, and a finished attempt whose start
#    was withdrawn (never sent): a version-2 peer could not decode or would misread them.
# 4: `AccountsDisabled`, and `Snapshot.disabled` (SPEC §20: a disable closes the account's
#    sockets), which a version-3 data plane could not decode or would ignore.
# 5: `Drain` (a control read waits for the data plane's queued reports), which a version-4 data
#    plane could not decode.
PROTOCOL_VERSION = 5


class _Msg(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", omit_defaults=True):
    pass


# ---- values carried by messages ------------------------------------------------------------


class Lease(msgspec.Struct, frozen=True, kw_only=True):
    """The data plane's view of one virtual key. `digest` = sha256(token)."""

    key_id: str
    digest: bytes
    account_id: str
    expires_at_ms: int
    principal_kind: str = ""
    principal_id: str = ""
    repo_slug: str = ""
    dispatch_id: str | None = None
    mint_decision_id: str | None = None
    worker_role: str | None = None
    # A dispatch key (SPEC §17): the conditions on which an attempt's end starts a gateway hop;
    # the data plane then admits no new attempt on the key (`fallback-pending`) until control
    # re-binds it. Empty for a caller-driven lease or a spent hop budget.
    hop_on: tuple[str, ...] = ()
    # SPEC §18, set by control when it pushes the lease (never stored in its key journal):
    # a budget applies somewhere on the lease's scope chain, and while one is exhausted, until
    # when its requests are refused (the latest reset among the exhausted budgets).
    budgeted: bool = False
    budget_retry_at_ms: int | None = None
    budget_stale: bool = False  # fleet mode (SPEC §19): the fleet's spend is stale; budgeted: 503
    hop: int = 0  # SPEC §8: the decision's hop (0 for a first mint); copied onto every row


class LeaseGate(msgspec.Struct, frozen=True, kw_only=True):
    """A lease's budget state (the two `Lease.budget*` fields), pushed when it changes."""

    key_id: str
    budgeted: bool
    budget_retry_at_ms: int | None = None
    budget_stale: bool = False


class AccountRoute(msgspec.Struct, frozen=True, kw_only=True):
    """What the data plane needs to reach an account; the credential by variable name only."""

    id: str
    provider_binding: str
    wire: str
    base_url: str
    auth_style: str
    credential_env: str
    request_capacity: int | None = None
    # The account's `models` globs (SPEC §4), which hold a lease's requests (SPEC §12); None
    # from a control daemon older than this field: not checked.
    models: tuple[str, ...] | None = None
    # Fleet mode: a lease ceiling makes the data plane stop serving the account while this
    # host's place in the fleet has lapsed (`dataplane/admission.FleetAdmission.lapsed`).
    lease_capacity: int | None = None


class Usage(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_creation_tokens: int = 0


class RateLimit(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One kind of an account's provider rate limit, as one upstream answer stated it (SPEC
    §22): `reset_at` absolute, ISO 8601 UTC. Unconstrained here (a value out of range must not
    cost a row its decoding); control range-checks it (`controlplane/core/headroom.py`)."""

    limit: int | None = None
    remaining: int | None = None
    reset_at: str | None = None


class RateLimits(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """Every kind an answer reported (absent kinds are omitted), and when the answer arrived."""

    observed_at: str
    requests: RateLimit | None = None
    tokens: RateLimit | None = None
    input_tokens: RateLimit | None = None
    output_tokens: RateLimit | None = None


RATE_LIMIT_KINDS = ("requests", "tokens", "input_tokens", "output_tokens")


class AttemptRow(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One attempt's terminal row: the ledger line and the routes view entry (SPEC §14).

    `gc=False`, as on its parts and the frames that carry it: it holds only scalars and frozen
    untracked Structs, so it can never be in a reference cycle and the collector need not track
    the two made per attempt (issue 27; `tests/unit/test_wire_untracked.py` keeps it so)."""

    attempt_id: str
    key_id: str
    account_id: str
    mint_decision_id: str | None
    dispatch_id: str | None
    repo_slug: str
    principal_id: str
    wire: str
    path: str
    requested_model: str | None
    served_model: str | None
    stream: bool
    started_at: str
    finished_at: str | None
    status: str | None
    http_status: int | None
    condition: str | None
    refusal_reason: str | None
    usage: Usage | None
    cost_usd: float | None
    cost_reason: str | None
    overhead_ms: float | None
    principal_kind: str = ""
    worker_role: str | None = None
    retry_after_s: float | None = None
    bytes_out: int = 0
    duration_ms: float | None = None
    # SPEC §21: the request's W3C trace context, copied only when valid (shared/tracecontext.py);
    # control parents the attempt's span under it.
    traceparent: str | None = None
    tracestate: str | None = None
    # SPEC §22: the provider's rate-limit headers of the upstream answer, parsed (null when the
    # answer carried none, or there was no answer).
    rate_limits: RateLimits | None = None
    transport: str = "http"  # SPEC §14, §20: "http" | "websocket"
    hop: int = 0  # SPEC §8, §14: the lease's hop, copied from it by the data plane
    # SPEC §14: ms from sending the request upstream to its first response byte (null: none came)
    first_byte_ms: float | None = None


# ---- messages ------------------------------------------------------------------------------


class Hello(_Msg, tag="hello", frozen=True):
    version: int
    role: str
    pid: int


class Welcome(_Msg, tag="welcome", frozen=True):
    version: int


class Refused(_Msg, tag="refused", frozen=True):
    reason: str


class Snapshot(_Msg, tag="snapshot", frozen=True):
    req_id: int
    leases: list[Lease]
    accounts: list[AccountRoute]
    storage_ok: bool = True
    # The price table's model globs (SPEC §18: a budgeted lease never spends on an unpriced
    # model); None from a control older than this field: not checked.
    priced: list[str] | None = None
    # The accounts an operator disabled (SPEC §9, §20): their sockets refuse new creates and close.
    disabled: list[str] | None = None


class LeaseAdded(_Msg, tag="lease_added", frozen=True):
    req_id: int
    lease: Lease


class LeaseRemoved(_Msg, tag="lease_removed", frozen=True):
    req_id: int
    key_ids: list[str]


class LeaseGates(_Msg, tag="lease_gates", frozen=True):
    """New budget states of live leases; a key the data plane does not hold is ignored (a
    gate never adds a lease)."""

    req_id: int
    gates: list[LeaseGate]


class AccountsDisabled(_Msg, tag="accounts_disabled", frozen=True):
    """Every account administratively disabled now (SPEC §9), the whole set, pushed when it
    changes: a socket on one refuses each new `response.create` (`administrative-disabled`) and,
    once its responses in flight finished, closes 1008 (SPEC §20). HTTP requests on its live
    leases are not refused (SPEC stops only its mints and renewals)."""

    req_id: int
    account_ids: list[str]


class Drain(_Msg, tag="drain", frozen=True):
    """Control is about to answer a read or decide on rows (issue 27): the data plane writes every
    report it holds back (the lazy ones waiting for company, the held starts) and then the `Ack`,
    on the same ordered link, so once control has the Ack and settled what came before it, it
    holds every attempt the data plane started and every one it finished before the Drain."""

    req_id: int


class StorageState(_Msg, tag="storage_state", frozen=True):
    ok: bool


class AttemptStarted(_Msg, tag="attempt_started", frozen=True, gc=False):
    row: AttemptRow


class AttemptFinished(_Msg, tag="attempt_finished", frozen=True, gc=False):
    req_id: int
    row: AttemptRow


class Ack(_Msg, tag="ack", frozen=True, gc=False):
    req_id: int
    ok: bool = True


class Acks(_Msg, tag="acks", frozen=True):
    """Several `Ack`s with one `ok` in one frame: control acknowledges one settle's rows at once
    (issue 27: one frame to encode and decode instead of one per row)."""

    req_ids: list[int]
    ok: bool = True


class Ping(_Msg, tag="ping", frozen=True):
    req_id: int


class SocketsOpen(_Msg, tag="sockets_open", frozen=True):
    """The data plane's open Responses WebSockets per account (SPEC §20), sent when they change
    and after each resync; the accounts view's `sockets_open`."""

    counts: dict[str, int]


class ConnectionCounts(_Msg, tag="connection_counts", frozen=True):
    """The data plane's SPEC §19 connection counters since it started: connections answered 503
    `connection-limit`, and closed for a request head not complete in time. Sent when they
    change (at most once a second) and after each resync; control's `/metrics`."""

    refused: int
    head_timeouts: int


class LoopReport(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    state: str  # running | restarting | failing (`shared/supervisor.LoopState`)
    failures: int
    restarts: int
    last_error_kind: str | None = None


class FleetLoops(_Msg, tag="fleet_loops", frozen=True):
    """Fleet mode: the data plane's supervised Redis loops (SPEC §19), sent when one fails or
    changes state and after each resync; control's fleet view and metrics list them."""

    loops: list[LoopReport]


Message = (
    Hello
    | Welcome
    | Refused
    | Snapshot
    | LeaseAdded
    | LeaseRemoved
    | StorageState
    | AttemptStarted
    | AttemptFinished
    | Ack
    | Acks
    | Ping
    | LeaseGates
    | SocketsOpen
    | ConnectionCounts
    | FleetLoops
    | AccountsDisabled
    | Drain
)
