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
from tests.support.waits import wait_until

HEAD = '{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-5-mini"'
EVENTS = [
    f'data: {HEAD},"choices":[{{"index":0,"delta":{{"role":"assistant","content":"he"}}}}],"usage":null}}\n\n',
    f'data: {HEAD},"choices":[{{"index":0,"delta":{{"content":"llo"}},"finish_reason":"stop"}}],"usage":null}}\n\n',
    f'data: {HEAD},"choices":[],"usage":{{"prompt_tokens":20,"completion_tokens":2,"total_tokens":22}}}}\n\n',
    "data: [DONE]\n\n",
]
UPSTREAM = "".join(EVENTS)
WITHOUT_USAGE_CHUNK = EVENTS[0] + EVENTS[1] + EVENTS[3]
BODY = (
    '{ "model" : "gpt-5-mini",\n  "stream": true, "temperature": 0.70,'
    ' "messages": [{"role":"user","content":"h\\u00e9"}] }'
)


def _chat(gw: Gateway, token: str, body: bytes, extra: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    return post_raw(
        gw,
        "/v1/chat/completions",
        body,
        {"authorization": f"Bearer {token}", "content-type": "application/json", **step(body=UPSTREAM), **extra},
    )


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
    status, _, received = _chat(hgw, minted["token"], gzip.compress(BODY.encode()), {"content-encoding": "gzip"})
    assert status == 200 and received.decode() == WITHOUT_USAGE_CHUNK
    entry = clean_stub.requests()[0]
    assert "content-encoding" not in entry["headers"]
    assert entry["body"] == '{"stream_options":{"include_usage":true},' + BODY[1:]
    _row(hgw, minted["key_id"])


def test_stream_options_without_include_usage_are_rewritten_in_place(hgw: Gateway, clean_stub: Stub) -> None:
    minted = mint_v2(hgw, MINI, "d-usage-3")
    body = (
        '{"model":"gpt-5-mini","stream":true,"stream_options": {"include_usage": false, '
        '"include_obfuscation": true},"messages":[{"role":"user","content":"x,}"}]}'
    )
    status, _, received = _chat(hgw, minted["token"], body.encode(), {})
    assert status == 200 and received.decode() == WITHOUT_USAGE_CHUNK
    assert clean_stub.requests()[0]["body"] == (
        '{"model":"gpt-5-mini","stream":true,"stream_options": {"include_usage": true, '
        '"include_obfuscation": true},"messages":[{"role":"user","content":"x,}"}]}'
    )  # only the member's value: every other byte as the worker sent it
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
    status, _, received = post_raw(
        hgw,
        "/v1/chat/completions",
        body.encode(),
        {"authorization": f"Bearer {minted['token']}", "content-type": "application/json"},
    )
    assert status == 200 and json.loads(received)["usage"]["completion_tokens"] == 3
    assert clean_stub.requests()[0]["body"] == body


def test_a_budget_holds_against_streams_that_never_asked_for_usage(hgw: Gateway, clean_stub: Stub) -> None:
    """The issue's break: 20 such streams passed a budget of $0.00001 (each row $0, usage null).
    Now each one is priced, and once they exhaust it the budget refuses 429 `budget-exhausted`."""
    revision = hgw.api("GET", "/control/v2/policy")[2]["revision"]
    status, _, body = hgw.api(
        "PUT",
        "/control/v2/policy/level",
        {
            "name": "repo:acme/usage-budget",
            "expected_revision": revision,
            "reason": "issue 21",
            "document": {"budgets": [{"window": "day", "usd": 0.00001}]},
        },
    )
    assert status == 200, body
    status, _, minted = hgw.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": "d-usage-budget",
            "repo_slug": "acme/usage-budget",
            "principal_kind": "worker",
            "principal_id": "w-1",
            "model": MINI,
        },
    )
    assert status == 201, minted
    plain = b'{"model":"gpt-5-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}'
    headers = {"authorization": f"Bearer {minted['token']}", "content-type": "application/json"}
    assert post_raw(hgw, "/v1/chat/completions", plain, headers)[0] == 200
    first = settled(hgw, minted["key_id"])[0]
    assert first["usage"] is not None and first["cost_usd"] > 0  # $0.0000081: two exhaust the budget
    answers = iter(range(20))
    refused = wait_until(
        lambda: (
            next(answers) is not None
            and ((answer := post_raw(hgw, "/v1/chat/completions", plain, headers))[0] == 429 and answer)
        ),
        15,
        "a request refused by the exhausted budget",
    )
    assert json.loads(refused[2])["error"]["code"] == "budget-exhausted"
