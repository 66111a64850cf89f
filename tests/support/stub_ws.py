"""The stub upstream's WebSocket side: `GET /v1/responses` with `Upgrade: websocket` (SPEC §20).

It behaves as OpenAI's WebSocket mode on the wire: one `response.create` a turn (flat: the
Responses request's fields beside `"type"`), answered with the same events as the SSE stream,
each a JSON text frame; `generate: false` (Codex's warmup) answers `response.created` and
`response.completed` with no output; `previous_response_id` must name a response this stub
completed (else an `error` event `previous_response_not_found`, status 400).

Each `response.create` takes the next script step (the FIFO of `POST /_stub/script`), and is
recorded as a request (`method: "WS"`, the handshake's headers, `model`, `generate`,
`previous_response_id`, `outcome`). Steps, besides `deltas`, `stall_between_events_s`,
`hold_after_events` + `hold`:
  ws_handshake_status (int; consumed by the handshake, not a create: refuse it with that status
  and an OpenAI error body, `headers` added), ws_error {code, status?, message?} (send an
  `error` event instead of the response, after `ws_error_after_events` events), ws_failed_code
  (end with `response.failed` carrying `response.error.code`), ws_cut_after_events (send N
  events, then drop the connection without a close frame), ws_close_after_events + ws_close_code
  (send N events, then close cleanly with that code), ws_function_call {name, arguments} (answer
  with one `function_call` output item: the client runs the tool and sends its output in a
  create chained by `previous_response_id`), ws_parallel (answer this create while reading the
  next ones, so two responses' events interleave on the socket, e.g. with `hold`),
  ws_pad (each text delta is this many bytes: a big answer), holds ({"<event index>": "<name>"}: several holds in one response, each as `hold`),
  ws_drop_on_next (a create arriving while this response is in flight makes the stub drop
  it silently: no more events, no terminal; it then answers that create, which may continue
  the dropped response by `previous_response_id`).
The created response echoes the create's `previous_response_id` and `metadata`, as OpenAI's
response object does.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
from aiohttp import WSMsgType, web

_enc = msgspec.json.encode
_dec = msgspec.json.decode


def _events(model: str, n: int, make: Any) -> list[dict[str, Any]]:
    return [_dec(ev.split(b"data: ", 1)[1].strip()) for ev in make(model, n)]


def _warmup(model: str, make: Any) -> list[dict[str, Any]]:
    full = _events(model, 0, make)
    done = full[-1]
    done["response"]["output"] = []
    done["response"]["usage"] = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
    return [full[0], done]


async def handshake(
    request: web.Request, state: Any, entry: dict[str, Any], rid: str, error_body: Any
) -> web.StreamResponse | None:
    """A refusal the script asks for, or None to accept the socket."""
    step = state.script[0] if state.script else {}
    status = step.get("ws_handshake_status")
    if status is None:
        return None
    state.script.popleft()
    entry["status"] = status
    headers = {
        "x-request-id": rid,
        "Content-Type": "application/json",
        **{str(k): str(v) for k, v in (step.get("headers") or {}).items()},
    }
    return web.Response(status=int(status), body=error_body("openai", int(status), None, rid), headers=headers)


async def serve(
    request: web.Request, state: Any, entry: dict[str, Any], make: Any, headers: dict[str, str] | None = None
) -> web.StreamResponse:
    ws = web.WebSocketResponse(compress=True, max_msg_size=64 * 1024 * 1024)
    ws.headers.update(headers or {})  # the 101's own headers (a provider's rate limits)
    await ws.prepare(request)
    entry["status"] = 101
    entry["outcome"] = "open"
    tasks: list[asyncio.Future[bool]] = []
    try:
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            try:
                data = _dec(msg.data)
            except msgspec.DecodeError:
                continue
            if isinstance(data, dict) and data.get("type") == "response.create":
                dropping = [t for t in tasks if not t.done() and getattr(t, "drop", False)]
                for task in dropping:
                    task.cancel()  # the stub drops a response in flight: no terminal
                await asyncio.gather(*dropping, return_exceptions=True)
                step = state.script[0] if state.script else {}
                if step.get("ws_parallel") or step.get("ws_drop_on_next"):
                    task = asyncio.ensure_future(_create(request, ws, state, entry, data, make))
                    task.drop = bool(step.get("ws_drop_on_next"))  # type: ignore[attr-defined]
                    tasks.append(task)
                elif not await _create(request, ws, state, entry, data, make):
                    break
    finally:
        for task in tasks:
            task.cancel()
        entry["outcome"] = entry.get("outcome") if entry["outcome"] != "open" else "closed"
    return ws


def _record(state: Any, handshake_entry: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    entry = {
        "method": "WS",
        "path": "/v1/responses",
        "headers": handshake_entry["headers"],
        "body_len": len(_enc(data)),
        "model": data.get("model"),
        "stream": True,
        "wire": "openai",
        "generate": data.get("generate", True),
        "previous_response_id": data.get("previous_response_id"),
        "time": time.time(),
        "status": 200,
        "outcome": None,
        "events_sent": 0,
        "first_sent_at": None,
        "last_sent_at": None,
    }
    state.requests.append(entry)
    return entry


async def _create(
    request: web.Request,
    ws: web.WebSocketResponse,
    state: Any,
    handshake_entry: dict[str, Any],
    data: dict[str, Any],
    make: Any,
) -> bool:
    """Answer one response.create; False when the socket was closed by the script."""
    entry = _record(state, handshake_entry, data)
    step = state.script.popleft() if state.script else {}
    model = str(data.get("model") or "")
    previous = data.get("previous_response_id")
    if data.get("generate") is False:
        events = _warmup(model, make)
    elif previous is not None and previous not in state.responses:
        events = [
            {
                "type": "error",
                "status": 400,
                "error": {
                    "type": "invalid_request_error",
                    "code": "previous_response_not_found",
                    "message": f"Previous response with id '{previous}' not found.",
                },
            }
        ]
    elif step.get("ws_function_call") is not None:
        events = _function_call(model, step["ws_function_call"], make)
    else:
        events = _events(model, int(step.get("deltas", 3)), make)
    pad = int(step.get("ws_pad") or 0)
    for event in events:  # the response object echoes what identifies its create
        if pad and event.get("type") == "response.output_text.delta":
            event["delta"] = "x" * pad
        if isinstance(event.get("response"), dict):
            event["response"]["previous_response_id"] = previous
            event["response"]["metadata"] = data.get("metadata") or {}
    events = _scripted(step, events)
    return await _send(request, ws, state, entry, step, events)


def _function_call(model: str, call: dict[str, Any], make: Any) -> list[dict[str, Any]]:
    """A turn that asks the client to call a tool (its output comes back in the next create)."""
    full = _events(model, 0, make)
    created, done = full[0], full[-1]
    item = {
        "type": "function_call",
        "id": "fc_" + done["response"]["id"][5:],
        "call_id": "call_" + done["response"]["id"][5:],
        "name": call.get("name", "shell"),
        "arguments": call.get("arguments", "{}"),
        "status": "completed",
    }
    done["response"]["output"] = [item]
    return [
        created,
        {"type": "response.output_item.added", "output_index": 0, "item": {**item, "status": "in_progress"}},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        done,
    ]


def _scripted(step: dict[str, Any], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    error = step.get("ws_error")
    if error is not None:
        at = int(step.get("ws_error_after_events", 0))
        event: dict[str, Any] = {
            "type": "error",
            "error": {"type": "server_error", "code": error.get("code"), "message": error.get("message", "stub")},
        }
        if "status" in error:
            event["status"] = error["status"]
        return events[:at] + [event]
    code = step.get("ws_failed_code")
    if code is not None:
        failed = dict(events[-1])
        failed["type"] = "response.failed"
        failed["response"] = {
            **failed["response"],
            "status": "failed",
            "error": {"code": code, "message": "stub failure"},
        }
        return events[:-1] + [failed]
    return events


async def _send(
    request: web.Request,
    ws: web.WebSocketResponse,
    state: Any,
    entry: dict[str, Any],
    step: dict[str, Any],
    events: list[dict[str, Any]],
) -> bool:
    cut, close = step.get("ws_cut_after_events"), step.get("ws_close_after_events")
    stop = (
        min(len(events), *(x for x in (cut, close) if x is not None))
        if cut is not None or close is not None
        else len(events)
    )
    between = step.get("stall_between_events_s") or 0
    holds = {int(k): str(v) for k, v in (step.get("holds") or {}).items()}
    if step.get("hold_after_events") is not None and step.get("hold"):
        holds[int(step["hold_after_events"])] = str(step["hold"])
    for i in range(stop):
        if i and between:
            await asyncio.sleep(between)
        if i in holds:
            try:
                await state.hold(holds[i]).wait()
            except asyncio.CancelledError:
                entry["outcome"] = "dropped"
                if events and isinstance(events[0].get("response"), dict):  # a successor may continue it
                    state.responses.add(events[0]["response"]["id"])
                raise
        await ws.send_str(_enc(events[i]).decode())
        now = time.time()
        entry["first_sent_at"] = entry["first_sent_at"] or now
        entry["last_sent_at"] = now
        entry["events_sent"] += 1
        if events[i].get("type") == "response.completed":
            state.responses.add(events[i]["response"]["id"])
    if cut is not None:
        entry["outcome"] = "cut"
        request.transport.abort()  # type: ignore[union-attr]
        return False
    if close is not None:
        entry["outcome"] = "closed"
        await ws.close(code=int(step.get("ws_close_code", 1000)))
        return False
    entry["outcome"] = "completed"
    return True
