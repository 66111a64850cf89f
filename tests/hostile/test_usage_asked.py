"""Usage the ledger needs is always asked for (SPEC §19).

The `openai` SDK streams chat completions without `stream_options.include_usage`; on main such a
stream left `usage: null` and added $0 to spend. Now the gateway sets the member upstream (every
other byte of the body unchanged, `content-length` recomputed, a compressed body sent decoded,
`accept-encoding: identity`) and removes the usage-only chunk from what the worker receives.

What differs from byte for byte, exactly: the request body gains `"stream_options":
{"include_usage":true},` after its opening brace (or its `stream_options` value is rewritten with
`include_usage` true), and the answer lacks the one event whose chunk has `"choices":[]` and a
`usage` object. Every other answer byte (the upstream's `"usage":null` members included) passes.
"""

from __future__ import annotations

import gzip
import json

from tests.hostile.conftest import MINI, mint_v2, post_raw
from tests.support.attempts import settled, step
from tests.support.harness import Gateway, Stub

HEAD = '{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-5-mini"'
EVENTS = [
    f'data: {HEAD},"choices":[{{"index":0,"delta":{{"role":"assistant","content":"he"}}}}],"usage":null}}\n\n',
    f'data: {HEAD},"choices":[{{"index":0,"delta":{{"content":"llo"}},"finish_reason":"stop"}}],"usage":null}}\n\n',
    f'data: {HEAD},"choices":[],"usage":{{"prompt_tokens":20,"completion_tokens":2,"total_tokens":22}}}}\n\n',
    "data: [DONE]\n\n",
]
UPSTREAM = "".join(EVENTS)
WITHOUT_USAGE_CHUNK = EVENTS[0] + EVENTS[1] + EVENTS[3]
BODY = ('{ "model" : "gpt-5-mini",\n  "stream": true, "temperature": 0.70,'
        ' "messages": [{"role":"user","content":"h\\u00e9"}] }')


def _chat(gw: Gateway, token: str, body: bytes, extra: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    return post_raw(gw, "/v1/chat/completions", body, {
        "authorization": f"Bearer {token}", "content-type": "application/json",
        **step(body=UPSTREAM), **extra})


def _row(gw: Gateway, key_id: str) -> dict:
    row = settled(gw, key_id)[0]
    assert row["status"] == "completed" and row["usage"]["output_tokens"] == 2
    assert row["usage"]["input_tokens"] == 20 and row["cost_reason"] == "priced"
    return row


def test_a_stream_without_include_usage_is_asked_for_it(hgw: Gateway, clean_stub: Stub) -> None:
    minted = mint_v2(hgw, MINI, "d-usage-1")
    status, headers, received = _chat(hgw, minted["token"], BODY.encode(), {"accept-encoding": "gzip"})
    assert status == 200 and headers["content-type"] == "text/event-stream"
    assert received.decode() == WITHOUT_USAGE_CHUNK
    entry = clean_stub.requests()[0]
    assert entry["body"] == '{"stream_options":{"include_usage":true},' + BODY[1:]
    assert entry["headers"]["accept-encoding"] == "identity"
    assert entry["headers"]["content-length"] == str(len(entry["body"].encode()))
    _row(hgw, minted["key_id"])


def test_a_compressed_body_goes_decoded(hgw: Gateway, clean_stub: Stub) -> None:
    minted = mint_v2(hgw, MINI, "d-usage-2")
    status, _, received = _chat(hgw, minted["token"], gzip.compress(BODY.encode()),
                                {"content-encoding": "gzip"})
    assert status == 200 and received.decode() == WITHOUT_USAGE_CHUNK
    entry = clean_stub.requests()[0]
    assert "content-encoding" not in entry["headers"]
    assert entry["body"] == '{"stream_options":{"include_usage":true},' + BODY[1:]
    _row(hgw, minted["key_id"])


def test_stream_options_without_include_usage_are_rewritten_in_place(hgw: Gateway, clean_stub: Stub) -> None:
    minted = mint_v2(hgw, MINI, "d-usage-3")
    body = ('{"model":"gpt-5-mini","stream":true,"stream_options": {"include_usage": false, '
            '"include_obfuscation": true},"messages":[{"role":"user","content":"x,}"}]}')
    status, _, received = _chat(hgw, minted["token"], body.encode(), {})
    assert status == 200 and received.decode() == WITHOUT_USAGE_CHUNK
    assert clean_stub.requests()[0]["body"] == (
        '{"model":"gpt-5-mini","stream":true,"stream_options": {"include_usage":true,'
        '"include_obfuscation":true},"messages":[{"role":"user","content":"x,}"}]}')
    _row(hgw, minted["key_id"])


def test_a_stream_that_asked_gets_every_byte(hgw: Gateway, clean_stub: Stub) -> None:
    minted = mint_v2(hgw, MINI, "d-usage-4")
    body = '{"model":"gpt-5-mini","stream":true,"stream_options":{"include_usage":true},"messages":[]}'
    status, _, received = _chat(hgw, minted["token"], body.encode(), {})
    assert status == 200 and received.decode() == UPSTREAM
    assert clean_stub.requests()[0]["body"] == body
    _row(hgw, minted["key_id"])


def test_a_non_streaming_body_is_untouched(hgw: Gateway, clean_stub: Stub) -> None:
    minted = mint_v2(hgw, MINI, "d-usage-5")
    body = '{"model":"gpt-5-mini","stream":false,"messages":[]}'
    status, _, received = post_raw(hgw, "/v1/chat/completions", body.encode(), {
        "authorization": f"Bearer {minted['token']}", "content-type": "application/json"})
    assert status == 200 and json.loads(received)["usage"]["completion_tokens"] == 3
    assert clean_stub.requests()[0]["body"] == body
