"""The stub upstream speaks the real wires and misbehaves exactly as scripted."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import aiohttp
import anthropic
import openai
import pytest

from tests.support.stub_upstream import (
    STUB_CACHE_CREATION_INPUT_TOKENS,
    STUB_CACHE_READ_INPUT_TOKENS,
    STUB_DEFAULT_DELTAS,
    STUB_INPUT_TOKENS,
    start_stub,
    stub_text,
)

AKEY, OKEY = "sk-ant-real", "sk-openai-real"
A_HEADERS = {"x-api-key": AKEY, "anthropic-version": "2023-06-01", "accept": "application/json"}
O_HEADERS = {"authorization": f"Bearer {OKEY}"}
A_BODY = {"model": "claude-sonnet-4-6", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
A_STREAM_ORDER = (
    ["message_start", "content_block_start", "ping"]
    + ["content_block_delta"] * STUB_DEFAULT_DELTAS
    + ["content_block_stop", "message_delta", "message_stop"]
)


@pytest.fixture
async def stub():
    runner, base_url = await start_stub(anthropic_key=AKEY, openai_key=OKEY)
    async with aiohttp.ClientSession(base_url) as session:
        yield base_url, session
    await runner.cleanup()


def parse_sse(text: str) -> list[tuple[str | None, str]]:
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        events.append((name, "\n".join(data)))
    return events


async def test_anthropic_stream_event_order_and_usage(stub):
    _, s = stub
    async with s.post("/v1/messages?beta=true", json={**A_BODY, "stream": True}, headers=A_HEADERS) as r:
        assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["request-id"].startswith("req_")
        events = parse_sse(await r.text())
    assert [name for name, _ in events] == A_STREAM_ORDER
    start = json.loads(events[0][1])["message"]
    assert start["model"] == "claude-sonnet-4-6"
    assert start["usage"] == {
        "input_tokens": STUB_INPUT_TOKENS,
        "output_tokens": 1,
        "cache_creation_input_tokens": STUB_CACHE_CREATION_INPUT_TOKENS,
        "cache_read_input_tokens": STUB_CACHE_READ_INPUT_TOKENS,
    }
    delta = json.loads(events[-2][1])
    assert delta["delta"]["stop_reason"] == "end_turn" and delta["usage"]["output_tokens"] == STUB_DEFAULT_DELTAS
    text = "".join(json.loads(d)["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == stub_text()

    async with s.get("/_stub/requests") as r:
        (rec,) = await r.json()
    assert rec["path"] == "/v1/messages?beta=true" and rec["model"] == "claude-sonnet-4-6"
    assert rec["stream"] is True and rec["headers"]["x-api-key"] == AKEY and rec["body_len"] > 0


async def test_anthropic_json_and_count_tokens(stub):
    _, s = stub
    async with s.post("/v1/messages", json=A_BODY, headers=A_HEADERS) as r:
        assert r.status == 200 and "request-id" in r.headers
        msg = await r.json()
    assert msg["type"] == "message" and msg["content"] == [{"type": "text", "text": stub_text()}]
    assert msg["usage"]["input_tokens"] == STUB_INPUT_TOKENS and msg["usage"]["output_tokens"] == STUB_DEFAULT_DELTAS
    async with s.post("/v1/messages/count_tokens", json=A_BODY, headers=A_HEADERS) as r:
        assert await r.json() == {"input_tokens": STUB_INPUT_TOKENS}
    async with s.get("/v1/models", headers=A_HEADERS) as r:
        assert (await r.json())["data"][0]["type"] == "model"
    async with s.get("/v1/models", headers=O_HEADERS) as r:
        assert (await r.json())["object"] == "list" and "x-request-id" in r.headers


@pytest.mark.parametrize(
    "headers",
    [
        {"x-api-key": "wrong"},
        {},
        {"x-api-key": "lhgw_leaked"},
        {"x-api-key": AKEY, "authorization": "Bearer lhgw_leaked"},
    ],
)
async def test_anthropic_refuses_bad_or_leaked_keys(stub, headers):
    _, s = stub
    async with s.post("/v1/messages", json=A_BODY, headers=headers) as r:
        assert r.status == 401
        body = await r.json()
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    assert body["request_id"] == r.headers["request-id"]


@pytest.mark.parametrize("auth", ["Bearer wrong", f"Bearer lhgw_{OKEY}"])
async def test_openai_refuses_bad_or_leaked_keys(stub, auth):
    _, s = stub
    async with s.post(
        "/v1/chat/completions", json={"model": "gpt-5", "messages": []}, headers={"authorization": auth}
    ) as r:
        assert r.status == 401 and "x-request-id" in r.headers
        assert (await r.json())["error"]["code"] == "invalid_api_key"


async def test_scripted_429_then_header_step_wins_over_queue(stub):
    _, s = stub
    steps = {"steps": [{"status": 429, "headers": {"retry-after": "7"}}, {"status": 529}]}
    async with s.post("/_stub/script", json=steps) as r:
        assert r.status == 200
    async with s.post("/v1/messages", json=A_BODY, headers=A_HEADERS) as r:
        assert r.status == 429 and r.headers["retry-after"] == "7"
        assert (await r.json())["error"]["type"] == "rate_limit_error"
    step = json.dumps({"status": 500, "headers": {"x-should-retry": "false"}})
    async with s.post("/v1/messages", json=A_BODY, headers={**A_HEADERS, "x-stub-step": step}) as r:
        assert r.status == 500 and r.headers["x-should-retry"] == "false"
    async with s.post("/v1/messages", json=A_BODY, headers=A_HEADERS) as r:
        assert r.status == 529 and (await r.json())["error"]["type"] == "overloaded_error"
    async with s.post("/v1/messages", json=A_BODY, headers=A_HEADERS) as r:
        assert r.status == 200


async def test_cut_after_events_aborts_but_eof_after_events_ends_cleanly(stub):
    _, s = stub
    body = {**A_BODY, "stream": True}
    cut = {**A_HEADERS, "x-stub-step": json.dumps({"cut_after_events": 4})}
    async with s.post("/v1/messages", json=body, headers=cut) as r:
        assert r.status == 200
        first = await r.content.readuntil(b"\n\n")
        assert first.startswith(b"event: message_start")
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()
    eof = {**A_HEADERS, "x-stub-step": json.dumps({"eof_after_events": 4, "gzip": True})}
    async with s.post("/v1/messages", json=body, headers=eof) as r:
        assert r.headers["content-encoding"] == "gzip"
        events = parse_sse(await r.text())
    assert [name for name, _ in events] == A_STREAM_ORDER[:4]


async def test_openai_chat_stream_and_websocket_refusal(stub):
    _, s = stub
    body = {"model": "gpt-5", "messages": [], "stream": True, "stream_options": {"include_usage": True}}
    async with s.post("/v1/chat/completions", json=body, headers=O_HEADERS) as r:
        events = parse_sse(await r.text())
    assert events[-1] == (None, "[DONE]")
    chunks = [json.loads(d) for _, d in events[:-1]]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["prompt_tokens"] == STUB_INPUT_TOKENS
    assert chunks[-1]["usage"]["completion_tokens"] == STUB_DEFAULT_DELTAS
    await s.post("/_stub/script", json={"steps": [{"ws_handshake_status": 426}]})
    ws = {**O_HEADERS, "upgrade": "websocket", "connection": "Upgrade"}
    async with s.get("/v1/responses", headers=ws) as r:
        assert r.status == 426  # scripted; unscripted, the stub speaks WebSocket mode


async def test_openai_websocket_mode(stub):
    _, s = stub
    async with s.ws_connect("/v1/responses", headers=O_HEADERS) as ws:
        await ws.send_json({"type": "response.create", "model": "gpt-5", "input": "hi"})
        events = [json.loads((await ws.receive(timeout=5)).data) for _ in range(4 + STUB_DEFAULT_DELTAS + 4)]
        assert events[-1]["type"] == "response.completed"
        await ws.send_json({"type": "response.create", "model": "gpt-5", "previous_response_id": "resp_nope"})
        error = json.loads((await ws.receive(timeout=5)).data)
        assert error["error"]["code"] == "previous_response_not_found"
        await ws.send_json(
            {
                "type": "response.create",
                "model": "gpt-5",
                "previous_response_id": events[-1]["response"]["id"],
                "generate": False,
            }
        )
        assert [json.loads((await ws.receive(timeout=5)).data)["type"] for _ in range(2)] == [
            "response.created",
            "response.completed",
        ]


async def test_real_anthropic_sdk_stream_and_json(stub):
    base_url, _ = stub
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key=AKEY, max_retries=0)
    try:
        msg = await client.messages.create(**A_BODY)
        assert msg.content[0].text == stub_text() and msg.usage.input_tokens == STUB_INPUT_TOKENS
        stream = await client.messages.create(**A_BODY, stream=True)
        kinds = [event.type async for event in stream]
        assert kinds == A_STREAM_ORDER[:2] + A_STREAM_ORDER[3:]  # the SDK swallows ping
        async with client.messages.stream(**A_BODY) as helper:
            assert await helper.get_final_text() == stub_text()
    finally:
        await client.close()


async def test_real_openai_sdk_chat_and_responses(stub):
    base_url, _ = stub
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=OKEY, max_retries=0)
    try:
        chat = await client.chat.completions.create(model="gpt-5", messages=[{"role": "user", "content": "hi"}])
        assert chat.choices[0].message.content == stub_text() and chat.usage.total_tokens == STUB_INPUT_TOKENS + 3
        async with client.responses.stream(model="gpt-5", input="hi") as stream:
            final = await stream.get_final_response()
        assert final.output_text == stub_text() and final.usage.input_tokens == STUB_INPUT_TOKENS
        emb = await client.embeddings.create(model="text-embedding-3-small", input=["a", "b"])
        assert len(emb.data) == 2
    finally:
        await client.close()


async def test_cli_prints_port_and_exits_on_sigterm(tmp_path):
    port_file = tmp_path / "port"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.stub_upstream",
        "--port",
        "0",
        "--port-file",
        str(port_file),
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
        assert line.startswith("stub_upstream listening on http://127.0.0.1:")
        assert line.endswith(f":{port_file.read_text()}")
        async with aiohttp.ClientSession() as s, s.get(line.split()[-1] + "/_stub/health") as r:
            assert r.status == 200 and await r.text() == "ok"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
