"""Scriptable fake LLM provider (Anthropic + OpenAI wires) for tests, `make run` and benchmarks.

Rule: the stub behaves like the real provider on the wire — same paths, auth headers, JSON and
SSE shapes, error bodies and request-id headers — and misbehaves only when a test scripts it.
It never accepts a credential starting with ``lhgw_`` (a leaked virtual key).

Routes. Anthropic: ``POST /v1/messages`` (query string allowed), ``POST /v1/messages/count_tokens``.
OpenAI: ``POST /v1/chat/completions``, ``POST /v1/responses``, ``POST /v1/embeddings``,
``GET /v1/responses`` (``Upgrade: websocket``: the WebSocket mode, ``tests/support/stub_ws.py``). ``GET /v1/models`` answers in the
Anthropic shape when the request carries ``anthropic-version`` or ``x-api-key`` (or presents the
Anthropic key), else in the OpenAI shape. Control (no credential): ``GET /_stub/health``,
``GET|POST|DELETE /_stub/script``, ``GET|DELETE /_stub/requests``, ``POST /_stub/release?name=``.

Auth. A key set to None is not checked. Otherwise every credential presented (``x-api-key``
and ``Authorization: Bearer``, either is accepted on both wires) must equal the wire's key, and
at least one must be presented. Refused requests are recorded but consume no script step.

Streaming is decided by ``"stream": true`` in the body, never by ``Accept``.

Script steps (JSON objects, all fields optional), from the ``x-stub-step`` request header
(wins; the queue is then not consumed) or else from the FIFO fed by ``POST /_stub/script``:
  status (int >= 400: provider-shaped error), headers (dict added to the answer), body (raw
  string body; with a 2xx streaming request it is split on blank lines into events),
  delay_s / stall_before_headers_s (sleep before headers), deltas (text deltas, default 3),
  cut_after_events (send N events then close the socket without the chunked terminator; for
  a JSON answer: half the body, Content-Length announced), eof_after_events (send N events then
  end the response cleanly; cut wins if both), stall_between_events_s, stall_after_events +
  stall_s, malformed_event_at (insert ``data: {malformed`` before event index i; it counts as
  an event), gzip (Content-Encoding: gzip; streams are compressed incrementally, flushed per
  event), reset (reset the connection (RST) instead of answering), reset_after_events (stream
  N events then reset the connection), hold_after_events + hold (a name: stream N events, then
  wait until ``POST /_stub/release?name=<hold>``; a release before the hold lets it through),
  raw_response (write this string to the socket as the
  whole answer, e.g. a malformed status line ``HTTP/1.1 999 Nope``, then close).

Each recorded request keeps its body (``body``, as text, when at most BODY_RECORD_CAP bytes) and says how it ended (``outcome``: ``completed``, ``cut``, ``reset``,
``raw`` or ``client-gone`` when the caller went away first: the gateway cancelled it), how
many events were sent and when (``first_sent_at`` / ``last_sent_at``, epoch seconds).

Usage is deterministic: see the STUB_* constants; output tokens == number of deltas, and the
text is ``stub_text(deltas)``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import itertools
import os
import signal
import socket
import struct
import sys
import time
import zlib
from typing import Any

import msgspec
from aiohttp import web

from tests.support import stub_ratelimits, stub_ws

STUB_INPUT_TOKENS = 12
STUB_CACHE_CREATION_INPUT_TOKENS = 5
STUB_CACHE_READ_INPUT_TOKENS = 7
STUB_OPENAI_CACHED_TOKENS = 4  # OpenAI: part of input/prompt tokens, as in the real API
STUB_DEFAULT_DELTAS = 3
STUB_EMBEDDING_DIM = 8
RECORD_LIMIT = 10_000  # most recent requests kept by /_stub/requests
BODY_RECORD_CAP = 4096  # a request body up to this size is recorded (as text) with its request
ANTHROPIC_MODELS = ("claude-sonnet-4-6", "claude-haiku-4-5", "claude-opus-4-7")
OPENAI_MODELS = ("gpt-5", "gpt-5-mini", "gpt-4.1", "text-embedding-3-small")

ANTHROPIC, OPENAI = "anthropic", "openai"
_enc = msgspec.json.encode
_dec = msgspec.json.decode
_PREFIX = os.urandom(4).hex()
_counter = itertools.count(1)
_NO_STEP: dict[str, Any] = {}
_MALFORMED = b"data: {malformed\n\n"


def _new_id(kind: str) -> str:
    return f"{kind}{_PREFIX}{next(_counter):08x}"


def _delta_text(i: int) -> str:
    return f"t{i} "


def stub_text(deltas: int = STUB_DEFAULT_DELTAS) -> str:
    """The full text of an answer with ``deltas`` text deltas ("t0 t1 t2 " for 3)."""
    return "".join(_delta_text(i) for i in range(deltas))


def _sse(event: str | None, data: Any) -> bytes:
    payload = _enc(data)
    if event is None:
        return b"data: " + payload + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + payload + b"\n\n"


# ---------------------------------------------------------------- errors

_A_ERR = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_O_ERR = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    402: ("insufficient_quota", "insufficient_quota"),
    403: ("invalid_request_error", "forbidden"),
    404: ("invalid_request_error", "not_found"),
    426: ("invalid_request_error", "upgrade_required"),
    429: ("requests", "rate_limit_exceeded"),
    503: ("server_error", "service_unavailable"),
}


def error_body(wire: str, status: int, message: str | None = None, request_id: str = "") -> bytes:
    """A provider-shaped error body for ``status``."""
    if wire == ANTHROPIC:
        etype = _A_ERR.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return _enc(
            {"type": "error", "error": {"type": etype, "message": message or f"stub {etype}"}, "request_id": request_id}
        )
    etype, code = _O_ERR.get(status, ("server_error" if status >= 500 else "invalid_request_error", None))
    return _enc({"error": {"message": message or f"stub {etype}", "type": etype, "param": None, "code": code}})


_AUTH_MSG = {ANTHROPIC: "invalid x-api-key", OPENAI: "Incorrect API key provided"}


def _auth_refusal(request: web.Request, key: str | None) -> bool:
    creds = list(request.headers.getall("x-api-key", ()))
    for value in request.headers.getall("authorization", ()):
        creds.append(value[7:].strip() if value[:7].lower() == "bearer " else value)
    if any(c.startswith("lhgw_") for c in creds):
        return True
    return key is not None and (not creds or any(c != key for c in creds))


# ---------------------------------------------------------------- answers (JSON and SSE events)


def _a_usage(output: int) -> dict[str, int]:
    return {
        "input_tokens": STUB_INPUT_TOKENS,
        "cache_creation_input_tokens": STUB_CACHE_CREATION_INPUT_TOKENS,
        "cache_read_input_tokens": STUB_CACHE_READ_INPUT_TOKENS,
        "output_tokens": output,
    }


_A_BLOCK_START = _sse(
    "content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
)
_A_PING = _sse("ping", {"type": "ping"})
_A_BLOCK_STOP = _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
_A_MESSAGE_STOP = _sse("message_stop", {"type": "message_stop"})


@functools.lru_cache(maxsize=256)
def _a_delta(i: int) -> bytes:
    return _sse(
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": _delta_text(i)}},
    )


def anthropic_message(model: str, n: int, data: Any = None) -> bytes:
    return _enc(
        {
            "id": _new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": stub_text(n)}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": _a_usage(n),
        }
    )


def anthropic_events(model: str, n: int, data: Any = None) -> list[bytes]:
    start = {
        "type": "message_start",
        "message": {
            "id": _new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _a_usage(1),
        },
    }
    return [
        _sse("message_start", start),
        _A_BLOCK_START,
        _A_PING,
        *(_a_delta(i) for i in range(n)),
        _A_BLOCK_STOP,
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": n},
            },
        ),
        _A_MESSAGE_STOP,
    ]


def _o_chat_usage(n: int) -> dict[str, Any]:
    return {
        "prompt_tokens": STUB_INPUT_TOKENS,
        "completion_tokens": n,
        "total_tokens": STUB_INPUT_TOKENS + n,
        "prompt_tokens_details": {"cached_tokens": STUB_OPENAI_CACHED_TOKENS},
    }


def chat_completion(model: str, n: int, data: Any = None) -> bytes:
    return _enc(
        {
            "id": _new_id("chatcmpl-"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": stub_text(n), "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": _o_chat_usage(n),
        }
    )


def chat_events(model: str, n: int, data: Any = None) -> list[bytes]:
    include_usage = bool(((data or {}).get("stream_options") or {}).get("include_usage"))
    head = {
        "id": _new_id("chatcmpl-"),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
    }
    extra = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _sse(None, {**head, "choices": [choice], **extra})

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": _delta_text(i)}) for i in range(n)]
    events.append(chunk({}, "stop"))
    if include_usage:
        events.append(_sse(None, {**head, "choices": [], "usage": _o_chat_usage(n)}))
    events.append(b"data: [DONE]\n\n")
    return events


def _r_usage(n: int) -> dict[str, Any]:
    return {
        "input_tokens": STUB_INPUT_TOKENS,
        "input_tokens_details": {"cached_tokens": STUB_OPENAI_CACHED_TOKENS},
        "output_tokens": n,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": STUB_INPUT_TOKENS + n,
    }


def _r_object(rid: str, model: str, status: str, output: list[Any], usage: Any) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "temperature": 1.0,
        "top_p": 1.0,
        "text": {"format": {"type": "text"}},
        "metadata": {},
        "usage": usage,
    }


def _r_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [_r_part(text)] if status == "completed" else []
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def _r_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def response_json(model: str, n: int, data: Any = None) -> bytes:
    item = _r_item(_new_id("msg_"), stub_text(n), "completed")
    return _enc(_r_object(_new_id("resp_"), model, "completed", [item], _r_usage(n)))


def response_events(model: str, n: int, data: Any = None) -> list[bytes]:
    rid, item_id, text = _new_id("resp_"), _new_id("msg_"), stub_text(n)
    loc = {"item_id": item_id, "output_index": 0, "content_index": 0}
    bodies: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": _r_object(rid, model, "in_progress", [], None)}),
        ("response.in_progress", {"response": _r_object(rid, model, "in_progress", [], None)}),
        ("response.output_item.added", {"output_index": 0, "item": _r_item(item_id, "", "in_progress")}),
        ("response.content_part.added", {**loc, "part": _r_part("")}),
        *(("response.output_text.delta", {**loc, "delta": _delta_text(i), "logprobs": []}) for i in range(n)),
        ("response.output_text.done", {**loc, "text": text, "logprobs": []}),
        ("response.content_part.done", {**loc, "part": _r_part(text)}),
        ("response.output_item.done", {"output_index": 0, "item": _r_item(item_id, text, "completed")}),
        (
            "response.completed",
            {"response": _r_object(rid, model, "completed", [_r_item(item_id, text, "completed")], _r_usage(n))},
        ),
    ]
    return [_sse(name, {"type": name, "sequence_number": seq, **data}) for seq, (name, data) in enumerate(bodies)]


def embeddings_json(model: str, n: int, data: Any) -> bytes:
    inputs = data.get("input")
    count = len(inputs) if isinstance(inputs, list) and inputs and not isinstance(inputs[0], int) else 1
    vector = [round(0.1 * (k + 1), 3) for k in range(STUB_EMBEDDING_DIM)]
    return _enc(
        {
            "object": "list",
            "model": model,
            "data": [{"object": "embedding", "index": i, "embedding": vector} for i in range(count)],
            "usage": {"prompt_tokens": STUB_INPUT_TOKENS, "total_tokens": STUB_INPUT_TOKENS},
        }
    )


_A_MODELS = _enc(
    {
        "data": [
            {"type": "model", "id": m, "display_name": m, "created_at": "2025-09-29T00:00:00Z"}
            for m in ANTHROPIC_MODELS
        ],
        "has_more": False,
        "first_id": ANTHROPIC_MODELS[0],
        "last_id": ANTHROPIC_MODELS[-1],
    }
)
_ANSWERS = {  # kind -> (JSON answer, SSE events or None); each takes (model, deltas, request JSON)
    "messages": (anthropic_message, anthropic_events),
    "chat": (chat_completion, chat_events),
    "responses": (response_json, response_events),
    "embeddings": (embeddings_json, None),
    "count_tokens": (lambda model, n, data: _enc({"input_tokens": STUB_INPUT_TOKENS}), None),
}
_O_MODELS = _enc(
    {
        "object": "list",
        "data": [{"id": m, "object": "model", "created": 1700000000, "owned_by": "openai"} for m in OPENAI_MODELS],
    }
)


# ---------------------------------------------------------------- sending


def _close_abruptly(request: web.Request) -> None:
    """End the connection without the chunked terminator (already-written bytes are flushed first)."""
    transport = request.transport
    if transport is not None:
        transport.close()


def _reset(request: web.Request) -> None:
    """Reset the connection (RST): SO_LINGER 0, then abort."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    transport.abort()


def _sent(entry: dict[str, Any]) -> None:
    now = time.time()
    if entry.get("first_sent_at") is None:
        entry["first_sent_at"] = now
    entry["last_sent_at"] = now
    entry["events_sent"] = entry.get("events_sent", 0) + 1


async def _send_body(
    request: web.Request, status: int, body: bytes, headers: dict[str, str], step: dict[str, Any], entry: dict[str, Any]
) -> web.StreamResponse:
    if step.get("gzip"):
        body = zlib.compress(body, wbits=31)
        headers["Content-Encoding"] = "gzip"
    cut = step.get("cut_after_events")
    _sent(entry)
    if cut is None:
        entry["outcome"] = "completed"
        return web.Response(status=status, body=body, headers=headers)
    headers["Content-Length"] = str(len(body))
    resp = web.StreamResponse(status=status, headers=headers)
    await resp.prepare(request)
    await resp.write(body[: len(body) // 2])
    _close_abruptly(request)
    entry["outcome"] = "cut"
    return resp


async def _send_stream(
    request: web.Request, events: list[bytes], headers: dict[str, str], step: dict[str, Any], entry: dict[str, Any]
) -> web.StreamResponse:
    gz = zlib.compressobj(wbits=31) if step.get("gzip") else None
    if gz is not None:
        headers["Content-Encoding"] = "gzip"
    headers.setdefault("Cache-Control", "no-cache")
    resp = web.StreamResponse(status=200, headers=headers)
    await resp.prepare(request)
    cut, eof = step.get("cut_after_events"), step.get("eof_after_events")
    reset = step.get("reset_after_events")
    if reset is not None:
        cut = reset
    stop = len(events) if cut is None and eof is None else min(len(events), cut if cut is not None else eof)
    between = step.get("stall_between_events_s") or 0
    stall_at, stall_s = step.get("stall_after_events"), step.get("stall_s") or 0
    hold_at, hold = step.get("hold_after_events"), step.get("hold")
    try:
        for i in range(stop):
            if i and between:
                await asyncio.sleep(between)
            if i == hold_at and hold:
                await request.app[STATE].hold(str(hold)).wait()
            if i == stall_at and stall_s:
                await asyncio.sleep(stall_s)
            chunk = events[i]
            await resp.write(gz.compress(chunk) + gz.flush(zlib.Z_SYNC_FLUSH) if gz is not None else chunk)
            _sent(entry)
        if stall_at == stop and stall_s:
            await asyncio.sleep(stall_s)
        if reset is not None:
            _reset(request)
            entry["outcome"] = "reset"
            return resp
        if cut is not None:
            _close_abruptly(request)
            entry["outcome"] = "cut"
            return resp
        if gz is not None:
            await resp.write(gz.flush(zlib.Z_FINISH))
        await resp.write_eof()
        entry["outcome"] = "completed"
    except ConnectionError:  # the client went away: nothing to log, nothing to finish
        entry["outcome"] = "client-gone"
    return resp


# ---------------------------------------------------------------- handlers


class StubState:
    """Per-app state: keys, the FIFO of script steps and the recorded requests."""

    def __init__(
        self, anthropic_key: str | None, openai_key: str | None, record_limit: int, rate_limit_headers: bool = False
    ) -> None:
        self.keys = {ANTHROPIC: anthropic_key, OPENAI: openai_key}
        self.rate_limits = stub_ratelimits.RateLimitHeaders() if rate_limit_headers else None
        self.script: collections.deque[dict[str, Any]] = collections.deque()
        self.requests: collections.deque[dict[str, Any]] = collections.deque(maxlen=record_limit)
        self.holds: dict[str, asyncio.Event] = {}
        self.responses: set[str] = set()  # ids completed on a socket (`previous_response_id`)

    def hold(self, name: str) -> asyncio.Event:
        return self.holds.setdefault(name, asyncio.Event())


STATE = web.AppKey("stub_state", StubState)


def _models_wire(request: web.Request, state: StubState) -> str:
    h = request.headers
    if "anthropic-version" in h or "x-api-key" in h:
        return ANTHROPIC
    akey = state.keys[ANTHROPIC]
    return ANTHROPIC if akey is not None and h.get("authorization", "")[7:].strip() == akey else OPENAI


def _route(wire: str | None, kind: str):
    async def handler(request: web.Request) -> web.StreamResponse:
        entry: dict[str, Any] = {}
        try:
            return await answer(request, entry)
        except asyncio.CancelledError:  # the caller went away (the stub runs with handler cancellation)
            entry["outcome"] = "client-gone"
            raise

    async def answer(request: web.Request, entry: dict[str, Any]) -> web.StreamResponse:
        state = request.app[STATE]
        raw = await request.read()
        w = wire or _models_wire(request, state)
        try:
            data = _dec(raw) if raw else {}
        except msgspec.DecodeError:
            data = None
        data_ok = isinstance(data, dict)
        headers_in: dict[str, str] = {}
        for name, value in request.headers.items():
            low = name.lower()
            headers_in[low] = f"{headers_in[low]}, {value}" if low in headers_in else value
        model = data.get("model") if data_ok else None
        stream = data_ok and data.get("stream") is True and _ANSWERS.get(kind, (0, None))[1] is not None
        entry.update(
            {
                "method": request.method,
                "path": request.path_qs,
                "headers": headers_in,
                "body_len": len(raw),
                "body_crc32": zlib.crc32(raw),  # a large body, compared without recording it
                "model": model,
                "stream": stream,
                "wire": w,
                "body": raw.decode("utf-8", "replace") if len(raw) <= BODY_RECORD_CAP else None,
                "time": time.time(),
                "status": None,
                "outcome": None,
                "events_sent": 0,
                "first_sent_at": None,
                "last_sent_at": None,
            }
        )
        state.requests.append(entry)
        rid = _new_id("req_")
        headers = {"request-id" if w == ANTHROPIC else "x-request-id": rid, "Content-Type": "application/json"}
        if stream:
            headers["Content-Type"] = "text/event-stream"

        if _auth_refusal(request, state.keys[w]):
            entry["status"] = 401
            return web.Response(status=401, body=error_body(w, 401, _AUTH_MSG[w], rid), headers=headers)
        limits = {} if state.rate_limits is None else state.rate_limits.headers(w)  # past the key check
        headers.update(limits)
        if kind == "ws" and request.headers.get("upgrade", "").lower() == "websocket":  # SPEC §20
            refused = await stub_ws.handshake(request, state, entry, rid, error_body)
            return refused or await stub_ws.serve(request, state, entry, response_events, limits)
        step_header = request.headers.get("x-stub-step")
        if step_header is not None:
            try:
                step = _dec(step_header)
                assert isinstance(step, dict)
            except (msgspec.DecodeError, AssertionError):
                return web.Response(status=400, text="stub: x-stub-step is not a JSON object")
        else:
            step = state.script.popleft() if state.script else _NO_STEP

        delay = (step.get("delay_s") or 0) + (step.get("stall_before_headers_s") or 0)
        if delay:
            await asyncio.sleep(delay)
        if step.get("reset") or step.get("raw_response") is not None:
            if step.get("reset"):
                entry["outcome"] = "reset"
                _reset(request)
            else:
                entry["outcome"] = "raw"
                request.transport.write(str(step["raw_response"]).encode())  # type: ignore[union-attr]
                _close_abruptly(request)
            return web.Response()  # never sent: the connection is gone
        status = step.get("status") or 200
        if status < 400 and not data_ok and request.method == "POST":
            status = 400
        if status >= 400 and "body" not in step:
            headers["Content-Type"] = "application/json"
        headers.update({str(k): str(v) for k, v in (step.get("headers") or {}).items()})
        entry["status"] = status
        n = int(step.get("deltas", STUB_DEFAULT_DELTAS))
        events: list[bytes] | None = None

        if "body" in step:
            body = str(step["body"]).encode()
            if stream and status < 400:
                events = [e + b"\n\n" for e in body.split(b"\n\n") if e.strip()]
        elif status >= 400:
            msg = "invalid JSON body" if not data_ok and status == 400 else None
            body = error_body(w, status, msg, rid)
        elif kind in _ANSWERS:
            make_json, make_events = _ANSWERS[kind]
            if stream:
                events = make_events(model or "", n, data)
            else:
                body = make_json(model or "", n, data)
        elif kind == "models":
            body = _A_MODELS if w == ANTHROPIC else _O_MODELS
        else:  # GET /v1/responses: no upgrade, 404
            status = entry["status"] = 404
            body = error_body(w, status, "Not found", rid)

        if events is not None:
            at = step.get("malformed_event_at")
            if at is not None:
                events.insert(int(at), _MALFORMED)
            return await _send_stream(request, events, headers, step, entry)
        return await _send_body(request, status, body, headers, step, entry)

    return handler


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _script(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if request.method == "DELETE":
        state.script.clear()
    elif request.method == "POST":
        try:
            steps = _dec(await request.read())["steps"]
            assert isinstance(steps, list) and all(isinstance(s, dict) for s in steps)
        except (msgspec.DecodeError, KeyError, TypeError, AssertionError):
            return web.Response(status=400, text='stub: expected {"steps": [{...}, ...]}')
        state.script.extend(steps)
    return web.Response(body=_enc({"steps": list(state.script)}), content_type="application/json")


async def _release(request: web.Request) -> web.Response:
    request.app[STATE].hold(request.query.get("name", "")).set()
    return web.Response(text="released")


async def _requests(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if request.method == "DELETE":
        state.requests.clear()
        return web.Response(body=b"[]", content_type="application/json")
    return web.Response(body=_enc(list(state.requests)), content_type="application/json")


def make_app(
    *,
    anthropic_key: str | None,
    openai_key: str | None,
    record_limit: int = RECORD_LIMIT,
    rate_limit_headers: bool = False,
) -> web.Application:
    """The stub as an aiohttp application (keys set to None are not checked); with
    `rate_limit_headers`, every answer carries a provider's rate-limit headers (stub_ratelimits)."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[STATE] = StubState(anthropic_key, openai_key, record_limit, rate_limit_headers)
    for method, path, wire, kind in (
        ("POST", "/v1/messages", ANTHROPIC, "messages"),
        ("POST", "/v1/messages/count_tokens", ANTHROPIC, "count_tokens"),
        ("POST", "/v1/chat/completions", OPENAI, "chat"),
        ("POST", "/v1/responses", OPENAI, "responses"),
        ("GET", "/v1/responses", OPENAI, "ws"),
        ("POST", "/v1/embeddings", OPENAI, "embeddings"),
        ("GET", "/v1/models", None, "models"),
    ):
        app.router.add_route(method, path, _route(wire, kind))
    app.router.add_get("/_stub/health", _health)
    for method in ("GET", "POST", "DELETE"):
        app.router.add_route(method, "/_stub/script", _script)
    for method in ("GET", "DELETE"):
        app.router.add_route(method, "/_stub/requests", _requests)
    app.router.add_post("/_stub/release", _release)
    return app


async def start_stub(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    anthropic_key: str | None = None,
    openai_key: str | None = None,
    **kwargs: Any,
) -> tuple[web.AppRunner, str]:
    """Start the stub in this event loop; returns (runner, "http://host:port"). Call runner.cleanup()."""
    runner = web.AppRunner(
        make_app(anthropic_key=anthropic_key, openai_key=openai_key, **kwargs),
        access_log=None,
        shutdown_timeout=1.0,
        handler_cancellation=True,
        max_field_size=64 * 1024,
        max_line_size=64 * 1024,
    )
    await runner.setup()
    # A deep accept queue, as the proxies in front of it have: a burst of 200 new upstream
    # connections (the benchmark's concurrent streams) must not lose SYNs to a full queue and
    # wait out a 1 s retransmission.
    await web.TCPSite(runner, host, port, backlog=1024).start()
    bound = runner.addresses[0]
    return runner, f"http://{bound[0]}:{bound[1]}"


async def _serve(args: argparse.Namespace) -> None:
    runner, base_url = await start_stub(
        args.host,
        args.port,
        anthropic_key=args.anthropic_key,
        openai_key=args.openai_key,
        rate_limit_headers=args.rate_limit_headers,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if args.port_file:
        tmp = f"{args.port_file}.tmp{os.getpid()}"
        with open(tmp, "w") as fh:
            fh.write(base_url.rsplit(":", 1)[1])
        os.replace(tmp, args.port_file)
    print(f"stub_upstream listening on {base_url}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.stub_upstream", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--anthropic-key", default=None)
    parser.add_argument("--openai-key", default=None)
    parser.add_argument("--port-file", default=None, help="write the bound port number here")
    parser.add_argument(
        "--rate-limit-headers", action="store_true", help="send a provider's rate-limit headers on every answer"
    )
    args = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:
        asyncio.run(_serve(args))
    else:
        uvloop.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
