"""What the socket relay reads from a frame, and what a socket error event stands for. Pure,
but for `read_message`, which has a reader process read a large message.

Client → upstream: every text message is held to SPEC §19's body rules (`strict_model`) and to
`GATEWAY_MAX_BODY_BYTES`; a `response.create` is one attempt (SPEC §20). A message of
`OFF_LOOP_BYTES` or more is read in a reader process (`read_message`, as `bodies.peek_body` reads
an HTTP body), with the same refusals; a reader lost is refused `internal-error` (500) on the
socket, as an HTTP body's is answered: the message was not read, so it never goes upstream.
Upstream → client: each event is decoded for its `type` only, and further where it ends a
response (`response.completed` / `response.incomplete` / `response.failed`, or `error`): the
usage and served model, and the HTTP status the event stands for (`evidence_status`, SPEC §20's
table), from which the row's condition follows as for HTTP (`condition_for_terminal`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

from dataplane.bodies import BodyRefused, ask_reader, strict_model
from dataplane.websocket.matching import Echo, create_echo
from dataplane.wires import openai
from shared.codes import Refusal
from shared.wire import Usage

CREATE = "response.create"
COMPLETED = "response.completed"
INCOMPLETE = "response.incomplete"
FAILED = "response.failed"
ERROR = "error"
TERMINAL = frozenset({COMPLETED, INCOMPLETE, FAILED, ERROR})

# SPEC §20: a socket error's code stands for the status the provider sends it with over HTTP.
CODE_STATUS: dict[str, int] = {
    "rate_limit_exceeded": 429,
    "insufficient_quota": 429,
    "server_error": 500,
    "invalid_api_key": 401,
}


# A reader process's request kind (`dataplane.bodyreader`): `message_answer` on a client message.
READ_MESSAGE = 2
ANSWER_MOST = 64 * 1024  # a reader's answer at most (an echo's metadata past it is dropped)


class ClientMessage(NamedTuple):
    type: str | None
    model: str | None
    generate: bool  # False for Codex's warmup (`generate: false`)
    echo: Echo | None = None  # a create's echo, when read off the loop (else `create_echo`)


class _ClientHead(msgspec.Struct):
    type: Any = None
    generate: Any = None


class _TypeOnly(msgspec.Struct):
    type: Any = None


class _Event(msgspec.Struct):
    type: Any = None
    status: Any = None
    code: Any = None
    error: Any = None
    response: Any = None


class Terminal(NamedTuple):
    kind: str  # COMPLETED, INCOMPLETE, FAILED or ERROR
    status: int | None  # the HTTP status it stands for; 200 for a completed response
    model: str | None
    usage: Usage | None


_head = msgspec.json.Decoder(_ClientHead).decode
_type_only = msgspec.json.Decoder(_TypeOnly).decode
_event = msgspec.json.Decoder(_Event).decode
_encode = msgspec.json.Encoder().encode


def client_message(data: bytes, max_bytes: int) -> ClientMessage:
    """One client text message, held to SPEC §19; `BodyRefused` when it fails them."""
    if len(data) > max_bytes:
        raise BodyRefused(Refusal.BODY_TOO_LARGE, f"the message exceeds {max_bytes} bytes")
    model = strict_model(data)
    head = _head(data)
    kind = head.type if isinstance(head.type, str) else None
    return ClientMessage(kind, model, head.generate is not False)


class _MessageAnswer(msgspec.Struct, array_like=True):
    """A reader process's answer on a client message: the refusal and its message, or what
    `client_message` and `create_echo` read."""

    refusal: Refusal | None
    message: str
    type: str | None = None
    model: str | None = None
    generate: bool = True
    echo: Echo | None = None


_encode_answer = msgspec.msgpack.Encoder().encode
_decode_answer = msgspec.msgpack.Decoder(_MessageAnswer).decode


def message_answer(data: bytes) -> bytes:
    """What a reader process answers for a client message (below `max_bytes`: checked before):
    `client_message`'s reading, and a create's `create_echo`, encoded; or its refusal."""
    try:
        read = client_message(data, len(data))
    except BodyRefused as refused:
        return _encode_answer(_MessageAnswer(refused.code, refused.message))
    echo = create_echo(data) if read.type == CREATE else None
    out = _encode_answer(_MessageAnswer(None, "", read.type, read.model, read.generate, echo))
    if echo is not None and len(out) > ANSWER_MOST:  # a huge metadata: matched without it
        echo = echo._replace(metadata=None)
        out = _encode_answer(_MessageAnswer(None, "", read.type, read.model, read.generate, echo))
    return out


async def read_message(data: bytes, max_bytes: int) -> ClientMessage:
    """`client_message` for a message of `OFF_LOOP_BYTES` or more, read in a reader process
    (SPEC §19: the loop is never held by a large message's parse); a reader lost on the way is
    BodyRefused(internal-error), as for an HTTP body."""
    if len(data) > max_bytes:
        raise BodyRefused(Refusal.BODY_TOO_LARGE, f"the message exceeds {max_bytes} bytes")
    return message_of(await ask_reader(data, READ_MESSAGE, len(data) + ANSWER_MOST))


def message_of(answer: bytes | bytearray) -> ClientMessage:
    """The ClientMessage a reader answered; BodyRefused for its refusal, or internal-error for
    an answer out of protocol (the message was not read: never waved through)."""
    try:
        got = _decode_answer(answer)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise BodyRefused(Refusal.INTERNAL_ERROR, "the gateway could not read the message") from None
    if got.refusal is not None:
        raise BodyRefused(got.refusal, got.message)
    return ClientMessage(got.type, got.model, got.generate, got.echo)


def event_type(data: bytes | str) -> str | None:
    """The `type` of an upstream event (None when it is not a JSON object naming one)."""
    try:
        kind = _type_only(data).type
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return kind if isinstance(kind, str) else None


def _code_of(error: Any) -> str | None:
    if isinstance(error, dict):
        code = error.get("code")
        return code if isinstance(code, str) else None
    return None


def evidence_status(status: Any, code: Any) -> int | None:
    """SPEC §20: the event's own `status` where it carries one, else the status its code is sent
    with over HTTP; never by its message; any other code: None."""
    if isinstance(status, int) and not isinstance(status, bool) and 100 <= status <= 599:
        return status
    return CODE_STATUS.get(code) if isinstance(code, str) else None


def terminal(kind: str, data: bytes | str) -> Terminal:
    """What a terminal event (`kind` in TERMINAL) says: its status, model and usage."""
    try:
        event = _event(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return Terminal(kind, None, None, None)
    if kind == ERROR:
        code = _code_of(event.error) or (event.code if isinstance(event.code, str) else None)
        return Terminal(kind, evidence_status(event.status, code), None, None)
    response = event.response if isinstance(event.response, dict) else {}
    model = response.get("model") if isinstance(response.get("model"), str) else None
    usage = _usage_of(response.get("usage"))
    if kind == FAILED:
        return Terminal(kind, evidence_status(event.status, _code_of(response.get("error"))), model, usage)
    return Terminal(kind, 200, model, usage)


def _usage_of(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    try:
        return openai._usage(msgspec.convert(raw, openai._Usage))
    except (msgspec.ValidationError, TypeError):
        return None


def error_event(code: str, message: str, status: int) -> str:
    """A gateway refusal on the socket: `{"type":"error","status",error:{type,code,message}}`."""
    kind = openai._ERROR_TYPE.get(status, "server_error")
    return _encode(
        {"type": ERROR, "status": status, "error": {"type": kind, "code": code, "message": message}}
    ).decode()
