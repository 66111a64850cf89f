"""`refusal_response` by table (SPEC §12, §15): a gateway-authored answer's status, headers and
body shape on both wires, for every refusal code the data plane answers with."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

import msgspec
import pytest

from dataplane.errors import NOT_RETRIED, OVERHEAD_HEADER, refusal_response
from dataplane.wires.table import WIRES as WIRE_TABLE
from shared.codes import HTTP_STATUS, ErrorCode, Refusal, Wire

REPO = Path(__file__).resolve().parents[2]
REQUEST_ID = "att_01J0000000000000000000000A"
REQUEST_ID_HEADER = {Wire.ANTHROPIC: "request-id", Wire.OPENAI: "x-request-id"}


class Expect(NamedTuple):
    status: int
    should_retry: str | None  # x-should-retry
    retry_after: str | None  # retry-after
    error_type: dict[Wire, str]  # error.type in the wire's body


class Case(NamedTuple):
    name: str
    given: tuple[Refusal | ErrorCode, int | None, float | None]  # code, status override, retry_after_s
    expect: Expect


def types(anthropic: str, openai: str) -> dict[Wire, str]:
    return {Wire.ANTHROPIC: anthropic, Wire.OPENAI: openai}


AUTH = types("authentication_error", "authentication_error")
INVALID = types("invalid_request_error", "invalid_request_error")
RATE = types("rate_limit_error", "rate_limit_error")
SERVER = types("api_error", "server_error")

CASES = [
    # before a lease
    Case("unknown-key", (Refusal.UNKNOWN_KEY, None, None), Expect(401, "false", None, AUTH)),
    Case("unauthenticated", (ErrorCode.UNAUTHENTICATED, None, None), Expect(401, "false", None, AUTH)),
    Case("invalid-request", (ErrorCode.INVALID_REQUEST, None, None), Expect(422, None, None, INVALID)),
    Case(
        "invalid-request at the status HTTP gives it",
        (ErrorCode.INVALID_REQUEST, 400, None),
        Expect(400, None, None, INVALID),
    ),
    Case(
        "internal-error at the status HTTP gives it",
        (Refusal.INTERNAL_ERROR, 503, None),
        Expect(503, None, None, SERVER),
    ),
    Case("websocket-not-supported", (Refusal.WEBSOCKET_NOT_SUPPORTED, None, None), Expect(426, None, None, INVALID)),
    Case(
        "control-unavailable, end unknown", (Refusal.CONTROL_UNAVAILABLE, None, None), Expect(503, None, None, SERVER)
    ),
    # an accepted attempt refused by the gateway
    Case(
        "path-not-served",
        (Refusal.PATH_NOT_SERVED, None, None),
        Expect(404, None, None, types("not_found_error", "not_found_error")),
    ),
    Case(
        "body-too-large",
        (Refusal.BODY_TOO_LARGE, None, None),
        Expect(413, None, None, types("request_too_large", "invalid_request_error")),
    ),
    Case("account-not-configured", (Refusal.ACCOUNT_NOT_CONFIGURED, None, None), Expect(422, None, None, INVALID)),
    Case("model-not-permitted", (Refusal.MODEL_NOT_PERMITTED, None, None), Expect(400, "false", None, INVALID)),
    # a socket's handshake on a disabled account (SPEC §20): SPEC's status for the code, not retried
    Case("administrative-disabled", (Refusal.ADMINISTRATIVE_DISABLED, None, None), Expect(409, "false", None, SERVER)),
    # hostile input (SPEC §19)
    Case("invalid-request-body", (Refusal.INVALID_REQUEST_BODY, None, None), Expect(400, "false", None, INVALID)),
    Case(
        "unsupported-content-encoding",
        (Refusal.UNSUPPORTED_CONTENT_ENCODING, None, None),
        Expect(415, "false", None, INVALID),
    ),
    Case("connection-limit", (Refusal.CONNECTION_LIMIT, None, 1), Expect(503, None, "1", SERVER)),
    Case(
        "fallback-pending (a dispatch key being moved)",
        (Refusal.FALLBACK_PENDING, None, 1.0),
        Expect(503, None, "1", SERVER),
    ),
    Case(
        "fleet-state-unavailable (a fleet-wide ceiling that cannot be checked)",
        (Refusal.FLEET_STATE_UNAVAILABLE, None, 1.0),
        Expect(503, None, "1", SERVER),
    ),
    Case("request-capacity-exhausted", (Refusal.REQUEST_CAPACITY_EXHAUSTED, None, 1), Expect(429, None, "1", RATE)),
    # budgets (SPEC §18): the data plane answers 429 where the mint holds 503; never retried at once
    Case(
        "budget-exhausted at the request", (Refusal.BUDGET_EXHAUSTED, 429, 3600.2), Expect(429, "false", "3601", RATE)
    ),
    Case(
        "budget-exhausted at its own status (the mint's)",
        (Refusal.BUDGET_EXHAUSTED, None, 60),
        Expect(503, "false", "60", SERVER),
    ),
    Case(
        "model-unpriced",
        (Refusal.MODEL_UNPRICED, None, None),
        Expect(403, "false", None, types("permission_error", "permission_error")),
    ),
    Case("pool-timeout", (Refusal.POOL_TIMEOUT, None, 1), Expect(503, None, "1", SERVER)),
    Case("gateway-shutdown", (Refusal.GATEWAY_SHUTDOWN, None, 1), Expect(503, None, "1", SERVER)),
    Case(
        "observation-storage-unavailable",
        (Refusal.OBSERVATION_STORAGE_UNAVAILABLE, None, 5),
        Expect(503, None, "5", SERVER),
    ),
    Case("internal-error", (Refusal.INTERNAL_ERROR, None, None), Expect(500, None, None, SERVER)),
    # no usable upstream answer
    Case("upstream-timeout", (ErrorCode.UPSTREAM_TIMEOUT, None, None), Expect(504, None, None, SERVER)),
    Case("upstream-unreachable", (ErrorCode.UPSTREAM_UNREACHABLE, None, None), Expect(502, None, None, SERVER)),
    Case("upstream-protocol-error", (ErrorCode.UPSTREAM_PROTOCOL_ERROR, None, None), Expect(502, None, None, SERVER)),
    # retry-after is whole seconds, rounded up, at least 1
    Case("a fraction of a second is 1", (Refusal.REQUEST_CAPACITY_EXHAUSTED, None, 0.2), Expect(429, None, "1", RATE)),
    Case("zero is 1", (Refusal.POOL_TIMEOUT, None, 0), Expect(503, None, "1", SERVER)),
    Case("a fraction rounds up", (Refusal.REQUEST_CAPACITY_EXHAUSTED, None, 2.5), Expect(429, None, "3", RATE)),
    Case("whole seconds stay", (Refusal.REQUEST_CAPACITY_EXHAUSTED, None, 3.0), Expect(429, None, "3", RATE)),
]
WIRES = [Wire.ANTHROPIC, Wire.OPENAI]


def answer(
    wire: Wire, code: Refusal, status: int | None = None, retry_after_s: float | None = None
) -> tuple[int, dict[str, str], dict]:
    response = refusal_response(
        WIRE_TABLE[wire], code, "a message", REQUEST_ID, 1.25, status=status, retry_after_s=retry_after_s
    )
    assert response.content_type == "application/json"
    return response.status, {k.lower(): v for k, v in response.headers.items()}, msgspec.json.decode(response.body)


def assert_shape(wire: Wire, body: dict, code: Refusal) -> dict:
    """The wire's error body, checked key by key; returns its `error` object."""
    if wire == Wire.ANTHROPIC:
        assert set(body) == {"type", "error", "request_id"}
        assert body["type"] == "error" and body["request_id"] == REQUEST_ID
        assert set(body["error"]) == {"type", "message", "code"}
    else:
        assert set(body) == {"error"}
        assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["param"] is None
    assert body["error"]["code"] == code
    return body["error"]


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_refusal_response(case: Case, wire: Wire) -> None:
    code, status_override, retry_after_s = case.given
    status, headers, body = answer(wire, code, status_override, retry_after_s)
    error = assert_shape(wire, body, code)
    assert (status, headers.get("x-should-retry"), headers.get("retry-after"), error["type"]) == (
        case.expect.status,
        case.expect.should_retry,
        case.expect.retry_after,
        case.expect.error_type[wire],
    )
    assert headers[REQUEST_ID_HEADER[wire]] == REQUEST_ID
    assert REQUEST_ID_HEADER[Wire.OPENAI if wire == Wire.ANTHROPIC else Wire.ANTHROPIC] not in headers
    assert headers[OVERHEAD_HEADER] == "1.250"


@pytest.mark.parametrize("wire", WIRES)
@pytest.mark.parametrize("code", [*Refusal, *ErrorCode], ids=str)
def test_every_code_answers_at_its_status_in_its_wire_shape(code: Refusal | ErrorCode, wire: Wire) -> None:
    status, headers, body = answer(wire, code)
    assert_shape(wire, body, code)
    assert status == HTTP_STATUS[code] and headers[REQUEST_ID_HEADER[wire]] == REQUEST_ID
    assert headers.get("x-should-retry") == ("false" if status == 401 or code in NOT_RETRIED else None)
    assert "retry-after" not in headers  # only when the end is known


def test_the_table_has_a_row_for_every_code_the_data_plane_answers_with() -> None:
    named = {
        node.attr
        for path in (REPO / "dataplane").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in ("Refusal", "ErrorCode")
    }
    codes = {Refusal[n] if n in Refusal.__members__ else ErrorCode[n] for n in named}
    assert named and codes <= {case.given[0] for case in CASES}
