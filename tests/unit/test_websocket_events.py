"""The socket relay's pure core (SPEC §20): client messages, terminal events, evidence, standing."""

from __future__ import annotations

import json

import pytest

from dataplane.bodies import BodyRefused
from dataplane.leases import LeaseReplica
from dataplane.websocket import events, gates, matching
from shared.codes import AttemptStatus, Refusal
from shared.evidence import condition_for_terminal
from shared.wire import Lease


@pytest.mark.parametrize(
    "status, code, expected",
    [
        (None, "rate_limit_exceeded", 429),
        (None, "insufficient_quota", 429),
        (None, "server_error", 500),
        (None, "invalid_api_key", 401),
        (None, "context_length_exceeded", None),
        (None, None, None),
        (503, "rate_limit_exceeded", 503),  # the event's own status wins
        (400, "server_error", 400),
        (True, "server_error", 500),  # a boolean is not a status
        (999, "server_error", 500),  # out of range: read the code
        ("429", None, None),  # a string is not a status
    ],
)
def test_evidence_status(status, code, expected) -> None:
    assert events.evidence_status(status, code) == expected


@pytest.mark.parametrize(
    "event, status, condition",
    [
        (
            {"type": "error", "error": {"type": "rate_limit_error", "code": "rate_limit_exceeded", "message": "x"}},
            429,
            "rate-limited",
        ),
        ({"type": "error", "code": "server_error", "message": "flat form"}, 500, "upstream-unavailable"),
        ({"type": "error", "status": 401, "error": {"code": "whatever"}}, 401, "credential-rejected"),
        (
            {"type": "error", "error": {"code": "rate_limit_exceeded", "message": "insufficient_quota"}},
            429,
            "rate-limited",
        ),
        (
            {"type": "error", "error": {"code": "bad", "message": "rate_limit_exceeded"}},
            None,
            None,
        ),  # never the message
        ({"type": "response.failed", "response": {"error": {"code": "server_error"}}}, 500, "upstream-unavailable"),
        ({"type": "response.failed", "response": {"error": None}}, None, None),
    ],
)
def test_failures_map_as_their_http_counterparts(event, status, condition) -> None:
    end = events.terminal(event["type"], json.dumps(event).encode())
    assert end.status == status
    found = condition_for_terminal(AttemptStatus.UPSTREAM_ERROR, end.status, None)
    assert (None if found is None else str(found)) == condition


def test_completed_carries_usage_and_model() -> None:
    event = {
        "type": "response.completed",
        "response": {
            "model": "gpt-5",
            "usage": {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 3},
        },
    }
    end = events.terminal(events.COMPLETED, json.dumps(event))
    assert (end.status, end.model) == (200, "gpt-5")
    assert (end.usage.input_tokens, end.usage.cache_read_tokens, end.usage.output_tokens) == (8, 4, 3)
    assert events.terminal(events.INCOMPLETE, b"{not json").status is None


@pytest.mark.parametrize(
    "data, expected",
    [
        (b'{"type": "response.output_text.delta", "delta": "x"}', "response.output_text.delta"),
        (b'{"delta": "x"}', None),
        (b"not json", None),
        (b'{"type": 3}', None),
        (b"[]", None),
    ],
)
def test_event_type(data, expected) -> None:
    assert events.event_type(data) == expected


def test_client_messages_are_held_to_the_body_rules() -> None:
    assert events.client_message(
        b'{"type": "response.create", "model": "gpt-5", "generate": false}', 100
    ) == events.ClientMessage("response.create", "gpt-5", False)
    assert events.client_message(b'{"type": "response.cancel"}', 100) == events.ClientMessage(
        "response.cancel", None, True
    )
    for bad in (
        b'{"model": "a", "model": "b"}',
        b'{"model": 5}',
        b"[1]",
        b'{"a": NaN}',
        b"{} {}",
        b"\xef\xbb\xbf{}",
        b'{"a": "\\ud800"}',
        b"\xff",
    ):
        with pytest.raises(BodyRefused) as refused:
            events.client_message(bad, 100)
        assert refused.value.code == Refusal.INVALID_REQUEST_BODY, bad
    with pytest.raises(BodyRefused) as refused:
        events.client_message(b'{"model": "gpt-5", "input": "' + b"x" * 100 + b'"}', 100)
    assert refused.value.code == Refusal.BODY_TOO_LARGE


def test_error_event_shape() -> None:
    assert json.loads(events.error_event("model-not-permitted", "no", 400)) == {
        "type": "error",
        "status": 400,
        "error": {"type": "invalid_request_error", "code": "model-not-permitted", "message": "no"},
    }


def _lease(**fields) -> Lease:
    base = dict(
        digest=b"d" * 32,
        key_id="k1",
        account_id="a1",
        expires_at_ms=10_000,
        mint_decision_id="dec-1",
        dispatch_id="d-1",
        repo_slug="r",
        principal_id="p",
    )
    base.update(fields)
    return Lease(**base)


def test_standing_says_how_a_socket_ends() -> None:
    replica = LeaseReplica(env={})
    lease = _lease(hop_on=("rate-limited",))
    replica.load([lease], [], True)
    assert gates.standing(replica, lease, 1_000, draining=False) is None
    assert gates.standing(replica, lease, 1_000, draining=True).close_code == gates.GOING_AWAY
    assert gates.standing(replica, lease, 10_000, draining=False).close_code == gates.POLICY_VIOLATION  # expired
    replica.hop_pending(lease, "rate-limited", None)
    assert gates.standing(replica, lease, 1_000, draining=False).close_code == gates.SERVICE_RESTART
    replica.add(_lease(mint_decision_id="dec-2", account_id="a2", hop_on=("rate-limited",)))  # the hop
    assert gates.standing(replica, lease, 1_000, draining=False).close_code == gates.SERVICE_RESTART
    replica.regate([])
    replica.remove("k1")
    found = gates.standing(replica, lease, 1_000, draining=False)
    assert (found.close_code, found.refusal.code) == (gates.POLICY_VIOLATION, Refusal.UNKNOWN_KEY)


def test_an_exhausted_budget_ends_a_socket_1008() -> None:
    replica = LeaseReplica(env={})
    lease = _lease(budgeted=True, budget_retry_at_ms=5_000)
    replica.load([lease], [], True)
    found = gates.standing(replica, lease, 1_000, draining=False)
    assert (found.close_code, found.refusal.code, found.refusal.status) == (
        gates.POLICY_VIOLATION,
        Refusal.BUDGET_EXHAUSTED,
        429,
    )
    assert gates.standing(replica, lease, 6_000, draining=False) is None  # reset by then


class _Fleet:
    """A `FleetAdmission` whose place lapsed: `hold()` says why (the rule `fleet_held` asks)."""

    def hold(self) -> str:
        return "this gateway host's place in the fleet has lapsed"


def test_the_handshake_and_create_gates_in_order() -> None:
    from shared.wire import AccountRoute

    replica = LeaseReplica(env={})
    lease = _lease(hop_on=("rate-limited",), budgeted=True, budget_retry_at_ms=5_000)
    replica.load([lease], [], True, priced=["gpt-*"])
    capped = AccountRoute(
        id="a1",
        provider_binding="openai",
        wire="openai",
        base_url="http://x",
        auth_style="bearer",
        credential_env="K",
        models=("gpt-*",),
        request_capacity=2,
    )

    def code(model, now=1_000, fleet=None):
        found = gates.hold(replica, lease, capped, model, now, fleet)
        return None if found is None else (found.code, found.status)

    assert code("claude-x") == (Refusal.MODEL_NOT_PERMITTED, 400)  # globs first
    assert code("gpt-5") == (Refusal.BUDGET_EXHAUSTED, 429)
    assert code(None, now=6_000) is None  # the handshake names no model
    assert code("gpt-5", now=6_000, fleet=_Fleet()) == (Refusal.FLEET_STATE_UNAVAILABLE, 503)
    replica.hop_pending(lease, "rate-limited", None)
    assert code("gpt-5") == (Refusal.FALLBACK_PENDING, 503)  # before the budget


async def test_a_slot_is_taken_and_given_back() -> None:
    from shared.capacity import CapacityTable
    from shared.wire import AccountRoute

    table = CapacityTable()
    account = AccountRoute(
        id="a1",
        provider_binding="openai",
        wire="openai",
        base_url="http://x",
        auth_style="bearer",
        credential_env="K",
        request_capacity=1,
    )
    assert await gates.take_slot(table, None, account, "h1") is None
    refused = await gates.take_slot(table, None, account, "h2")
    assert (refused.code, refused.status, refused.retry_after_s) == (Refusal.REQUEST_CAPACITY_EXHAUSTED, 429, 1)
    gates.give_slot(table, None, "h1")
    assert await gates.take_slot(table, None, account, "h2") is None


def test_the_sweeps_bounds_end_a_socket() -> None:
    """Idle upstream while a response is in flight → 1011 transport-error; a worker accepting
    nothing for the stall bound → client-aborted; an idle socket with nothing in flight is held."""
    from types import SimpleNamespace

    from dataplane.websocket.session import SocketSession
    from shared.codes import AttemptStatus
    from shared.wire import AccountRoute

    account = AccountRoute(
        id="a1", provider_binding="openai", wire="openai", base_url="http://x", auth_style="bearer", credential_env="K"
    )

    def session() -> SocketSession:
        return SocketSession(SimpleNamespace(), _lease(), account, None, None)  # type: ignore[arg-type]

    idle = session()
    idle.upstream_at = 0.0
    idle.bound(1000.0, idle_s=300, stall_s=60)
    assert idle.closing is None  # nothing in flight: held
    idle.attempts.add(object(), matching.Echo())  # type: ignore[arg-type]
    idle.bound(299.0, idle_s=300, stall_s=60)
    assert idle.closing is None
    idle.bound(301.0, idle_s=300, stall_s=60)
    assert (idle.closing.code, idle.closing.cut) == (gates.INTERNAL_ERROR, AttemptStatus.TRANSPORT_ERROR)
    stalled = session()
    stalled.writing_since = 10.0
    stalled.bound(69.0, idle_s=300, stall_s=60)
    assert stalled.closing is None
    stalled.bound(71.0, idle_s=300, stall_s=60)
    assert (stalled.closing.by, stalled.closing.cut) == ("client", AttemptStatus.CLIENT_ABORTED)
    assert stalled.done.is_set()
