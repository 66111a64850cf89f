"""RPC framing by table, and golden frames that keep old encodings decodable."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from shared.rpc import FRAME_CAP, FrameError, decode_body, encode_frame, split_frames
from shared.wire import Ack, AttemptRow, AttemptStarted, Hello, Lease, LeaseAdded, LeaseRemoved

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "rpc_golden.bin"
HELLO = Hello(version=1, role="dataplane", pid=42)
ACK = Ack(req_id=7)


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


CASES = [
    ("empty buffer", b"", [], b""),
    ("one whole frame", encode_frame(HELLO), [HELLO], b""),
    ("two frames", encode_frame(HELLO) + encode_frame(ACK), [HELLO, ACK], b""),
    ("partial header waits", encode_frame(ACK)[:3], [], encode_frame(ACK)[:3]),
    ("partial body waits", encode_frame(ACK)[:-1], [], encode_frame(ACK)[:-1]),
    ("frame then partial", encode_frame(ACK) + encode_frame(HELLO)[:5], [ACK], encode_frame(HELLO)[:5]),
]


@pytest.mark.parametrize("name,buffer,messages,rest", CASES, ids=[c[0] for c in CASES])
def test_split_frames(name, buffer, messages, rest) -> None:
    assert split_frames(buffer) == (messages, rest)


BAD = [
    ("zero length", struct.pack(">I", 0), "empty-frame"),
    ("over the cap, refused from the header alone", struct.pack(">I", FRAME_CAP + 1), "frame-too-large"),
    ("not msgpack", frame(b"\xc1\xc1\xc1"), "malformed-frame"),
    ("msgpack but no known op", frame(b"\x81\xa2op\xa4nope"), "malformed-frame"),
    ("known op, missing field", frame(b"\x81\xa2op\xa3ack"), "malformed-frame"),
]


@pytest.mark.parametrize("name,buffer,reason", BAD, ids=[c[0] for c in BAD])
def test_bad_frames_are_frame_errors(name, buffer, reason) -> None:
    with pytest.raises(FrameError) as caught:
        split_frames(buffer)
    assert caught.value.reason == reason


LEASE = Lease(
    key_id="01J0000000000000000000000A",
    digest=b"\x00" * 32,
    account_id="legacy-anthropic",
    expires_at_ms=1_800_000_000_000,
    principal_kind="worker",
    principal_id="w",
    repo_slug="acme/app",
)
ROW = AttemptRow(
    attempt_id="att_1",
    key_id=LEASE.key_id,
    account_id="legacy-anthropic",
    mint_decision_id=None,
    dispatch_id=None,
    repo_slug="acme/app",
    principal_id="w",
    wire="anthropic",
    path="/v1/messages",
    requested_model="m",
    served_model=None,
    stream=True,
    started_at="2026-01-01T00:00:00.000Z",
    finished_at=None,
    status=None,
    http_status=None,
    condition=None,
    refusal_reason=None,
    usage=None,
    cost_usd=None,
    cost_reason=None,
    overhead_ms=None,
)
GOLDEN_MESSAGES = [
    HELLO,
    ACK,
    LeaseAdded(req_id=3, lease=LEASE),
    LeaseRemoved(req_id=4, key_ids=[LEASE.key_id]),
    AttemptStarted(row=ROW),
]


def test_golden_frames_still_decode() -> None:
    if not GOLDEN.exists():  # first run writes the golden file; later runs hold the encoding still
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_bytes(b"".join(encode_frame(m) for m in GOLDEN_MESSAGES))
    messages, rest = split_frames(GOLDEN.read_bytes())
    assert messages == GOLDEN_MESSAGES and rest == b""


def test_no_message_carries_a_token_field() -> None:
    """Usage counts (`input_tokens`) are billing numbers; a `token` field would be a credential."""
    import re

    import shared.wire as wire

    credential_like = re.compile(r"(^|_)(token|secret|api_key)($|_)")
    checked = 0
    for name in dir(wire):
        fields = getattr(getattr(wire, name), "__struct_fields__", ())
        checked += len(fields)
        assert not any(credential_like.search(f) for f in fields), name
    assert checked > 50


def test_decode_body_rejects_trailing_garbage() -> None:
    with pytest.raises(FrameError):
        decode_body(encode_frame(ACK)[4:] + b"\x00")


def test_an_account_route_carries_its_globs_and_an_older_one_decodes_without() -> None:
    """`AccountRoute.models` was appended with a default: a snapshot from a control daemon older
    than it still decodes (globs None: the data plane does not check), a new one round-trips."""
    import msgspec

    from shared.wire import AccountRoute, Snapshot

    route = {
        "id": "acct-a",
        "provider_binding": "anthropic",
        "wire": "anthropic",
        "base_url": "http://x",
        "auth_style": "x-api-key",
        "credential_env": "GATEWAY_A_KEY",
        "request_capacity": None,
    }
    older = decode_body(msgspec.msgpack.encode({"op": "snapshot", "req_id": 1, "leases": [], "accounts": [route]}))
    assert isinstance(older, Snapshot) and older.accounts[0].models is None
    current = Snapshot(req_id=2, leases=[], accounts=[AccountRoute(**route, models=("claude-haiku-*",))])
    assert split_frames(encode_frame(current)) == ([current], b"")


def test_a_row_carries_its_trace_context_and_a_row_without_decodes() -> None:
    """`AttemptRow.traceparent` / `tracestate` (SPEC §21) were appended with defaults: the golden
    row above (written before them) decodes with both None; a row holding them round-trips."""
    import msgspec

    from shared.wire import AttemptFinished

    traced = msgspec.structs.replace(
        ROW, traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", tracestate="congo=t61rcWkgMzE"
    )
    message = AttemptFinished(req_id=9, row=traced)
    assert split_frames(encode_frame(message)) == ([message], b"")
    golden_row = split_frames(GOLDEN.read_bytes())[0][-1].row
    assert golden_row.traceparent is None and golden_row.tracestate is None


def test_acks_are_grouped_per_connection_in_order() -> None:
    from shared.rpc import acks_by_connection

    a, b = object(), object()
    grouped = acks_by_connection([(a, 1), (b, 2), (a, 3), (a, 4)])  # type: ignore[list-item]
    assert grouped == {a: [1, 3, 4], b: [2]}


def test_send_acks_sends_one_frame_per_connection_whatever_the_count() -> None:
    from shared.rpc import send_acks
    from shared.wire import Ack, Acks

    class Conn:
        def __init__(self, gone: bool = False) -> None:
            self.sent: list[object] = []
            self.gone = gone

        def send_nowait(self, message: object) -> None:
            if self.gone:
                raise ConnectionError("rpc connection closed")
            self.sent.append(message)

    a, b, gone = Conn(), Conn(), Conn(gone=True)
    send_acks([(a, 7)], False)  # type: ignore[list-item]
    send_acks([(gone, 8)], True)  # type: ignore[list-item]  # passed over, as with several rows
    send_acks([(a, 1), (b, 2), (gone, 5), (a, 3)], True)  # type: ignore[list-item]
    send_acks([], True)
    assert a.sent == [Ack(req_id=7, ok=False), Acks(req_ids=[1, 3], ok=True)]
    assert b.sent == [Ack(req_id=2, ok=True)]
