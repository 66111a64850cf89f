"""Both wires through the real SDKs: every endpoint, what reached the stub, what came back.

Each test mints its own lease and checks the stub's record of the request (credential swapped
in, the virtual key gone, end-to-end headers kept), the answer the SDK got (request id,
`x-leasehold-overhead-ms`, rate-limit headers), and the single terminal row with its usage.
"""

from __future__ import annotations

import gzip
import http.client
import json
import urllib.request

import anthropic
import openai
import pytest

from tests.support.attempts import (
    A_BODY,
    A_HEADERS,
    A_MODEL,
    MESSAGES,
    O_MODEL,
    anthropic_sdk,
    assert_swapped,
    one_row,
    openai_sdk,
    settled,
    step,
    stub_entry,
)
from tests.support.harness import Gateway, Stub
from tests.support.harness import http as call
from tests.support.stub_upstream import (
    ANTHROPIC_MODELS,
    OPENAI_MODELS,
    STUB_CACHE_CREATION_INPUT_TOKENS,
    STUB_CACHE_READ_INPUT_TOKENS,
    STUB_INPUT_TOKENS,
    STUB_OPENAI_CACHED_TOKENS,
    stub_text,
)

A_USAGE = {
    "input_tokens": STUB_INPUT_TOKENS,
    "output_tokens": 3,
    "cache_read_tokens": STUB_CACHE_READ_INPUT_TOKENS,
    "cache_creation_tokens": STUB_CACHE_CREATION_INPUT_TOKENS,
}
O_USAGE = {
    "input_tokens": STUB_INPUT_TOKENS - STUB_OPENAI_CACHED_TOKENS,
    "output_tokens": 3,
    "cache_read_tokens": STUB_OPENAI_CACHED_TOKENS,
    "cache_creation_tokens": 0,
}


def _overhead(headers) -> float:
    value = float(headers["x-leasehold-overhead-ms"])
    assert 0 <= value < 1000, value
    return value


# ---- Anthropic wire -------------------------------------------------------------------------


def test_anthropic_messages_non_streaming(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint()
    sdk = anthropic_sdk(gateway, minted["token"])
    raw = sdk.messages.with_raw_response.create(model=A_MODEL, max_tokens=16, messages=MESSAGES)
    message = raw.parse()
    assert message.content[0].text == stub_text() and message.model == A_MODEL
    assert raw.headers["request-id"].startswith("req_")  # the upstream's own id, passed through
    _overhead(raw.headers)

    entry = stub_entry(clean_stub)
    assert entry["path"] == "/v1/messages" and entry["stream"] is False
    assert_swapped(entry, minted["token"], "x-api-key", clean_stub.anthropic_key)
    assert entry["headers"]["anthropic-version"]  # the SDK's own value, unchanged
    assert entry["headers"]["user-agent"].startswith("Anthropic/Python")
    assert "x-stainless-lang" in entry["headers"]

    row = one_row(gateway, minted["key_id"])
    assert (row["status"], row["http_status"], row["stream"]) == ("completed", 200, False)
    assert row["path"] == "/v1/messages" and row["wire"] == "anthropic"
    assert row["requested_model"] == row["served_model"] == A_MODEL
    assert row["usage"] == A_USAGE and row["cost_reason"] == "priced" and row["cost_usd"] > 0
    assert row["overhead_ms"] is not None and row["overhead_ms"] >= 0


def test_anthropic_beta_stream_keeps_query_and_beta_header(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint()
    sdk = anthropic_sdk(gateway, minted["token"])
    betas = ["interleaved-thinking-2025-05-14", "context-management-2025-06-27"]
    # Claude Code always sends ?beta=true (this SDK version does not add it by itself).
    with sdk.beta.messages.stream(
        model=A_MODEL, max_tokens=16, messages=MESSAGES, betas=betas, extra_query={"beta": "true"}
    ) as stream:
        assert stream.get_final_text() == stub_text()
        assert stream.response.headers["request-id"].startswith("req_")
        _overhead(stream.response.headers)
        assert stream.response.headers["content-type"].startswith("text/event-stream")

    entry = stub_entry(clean_stub)
    assert entry["path"] == "/v1/messages?beta=true" and entry["stream"] is True
    assert entry["headers"]["anthropic-beta"] == ",".join(betas)
    assert entry["headers"]["x-stainless-helper-method"] == "stream"
    assert_swapped(entry, minted["token"], "x-api-key", clean_stub.anthropic_key)
    row = one_row(gateway, minted["key_id"])
    assert (row["status"], row["stream"], row["usage"]) == ("completed", True, A_USAGE)
    assert row["path"] == "/v1/messages" and row["served_model"] == A_MODEL


def test_anthropic_count_tokens_and_models(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint()
    sdk = anthropic_sdk(gateway, minted["token"])
    counted = sdk.messages.count_tokens(model=A_MODEL, messages=MESSAGES)
    assert counted.input_tokens == STUB_INPUT_TOKENS
    assert [m.id for m in sdk.models.list()] == list(ANTHROPIC_MODELS)

    seen = clean_stub.requests()
    assert [(e["method"], e["path"]) for e in seen] == [("POST", "/v1/messages/count_tokens"), ("GET", "/v1/models")]
    for entry in seen:
        assert_swapped(entry, minted["token"], "x-api-key", clean_stub.anthropic_key)
    rows = settled(gateway, minted["key_id"], 2)
    assert [r["path"] for r in rows] == ["/v1/messages/count_tokens", "/v1/models"]
    assert all(r["status"] == "completed" and r["usage"] is None for r in rows)
    assert all(r["cost_usd"] == 0.0 and r["cost_reason"] == "not-billed" for r in rows)  # SPEC §19


def test_zai_harness_binding_uses_bearer_on_the_anthropic_wire(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint("zai-harness")
    status, headers, body = call(
        "POST",
        gateway.dataplane_url + "/v1/messages",
        {**A_BODY, "model": "glm-9-unlisted"},
        {**A_HEADERS, "x-api-key": minted["token"]},
    )
    assert status == 200 and body["content"][0]["text"] == stub_text()
    assert_swapped(stub_entry(clean_stub), minted["token"], "authorization", clean_stub.anthropic_key)
    row = one_row(gateway, minted["key_id"])
    assert row["account_id"] == "legacy-zai-harness" and row["served_model"] == "glm-9-unlisted"
    assert row["cost_usd"] is None and row["cost_reason"] == "unpriced"  # never 0


# ---- OpenAI wire ----------------------------------------------------------------------------


def test_openai_chat_non_streaming_strips_organization(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint("openai")
    sdk = openai_sdk(gateway, minted["token"], organization="org-worker", project="proj-worker")
    raw = sdk.chat.completions.with_raw_response.create(model=O_MODEL, messages=MESSAGES)
    completion = raw.parse()
    assert completion.choices[0].message.content == stub_text()
    assert raw.headers["x-request-id"].startswith("req_")
    _overhead(raw.headers)

    entry = stub_entry(clean_stub)
    assert entry["path"] == "/v1/chat/completions"
    assert_swapped(entry, minted["token"], "authorization", clean_stub.openai_key)
    assert "openai-organization" not in entry["headers"] and "openai-project" not in entry["headers"]
    assert entry["headers"]["user-agent"].startswith("OpenAI/Python")
    row = one_row(gateway, minted["key_id"])
    assert (row["status"], row["wire"], row["usage"]) == ("completed", "openai", O_USAGE)
    assert row["served_model"] == O_MODEL and row["cost_reason"] == "priced"


def test_openai_chat_stream_takes_usage_from_the_final_chunk(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint("openai")
    sdk = openai_sdk(gateway, minted["token"])
    chunks = list(
        sdk.chat.completions.create(
            model=O_MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == stub_text()
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    without = list(sdk.chat.completions.create(model=O_MODEL, messages=MESSAGES, stream=True))
    assert all(c.usage is None and c.choices for c in without)  # no usage chunk it did not ask for
    assert "".join(c.choices[0].delta.content or "" for c in without) == stub_text()

    rows = settled(gateway, minted["key_id"], 2)
    assert [r["stream"] for r in rows] == [True, True]
    assert rows[0]["status"] == rows[1]["status"] == "completed"
    assert rows[0]["usage"] == O_USAGE
    # SPEC §19: the gateway asked for the usage the worker did not (the openai SDK's default)
    assert rows[1]["usage"] == O_USAGE and rows[1]["cost_reason"] == "priced"


def test_openai_responses_json_and_stream(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint("openai")
    sdk = openai_sdk(gateway, minted["token"])
    response = sdk.responses.create(model=O_MODEL, input="hi")
    assert response.output_text == stub_text()
    with sdk.responses.stream(model=O_MODEL, input="hi") as stream:
        final = stream.get_final_response()
    assert final.output_text == stub_text()

    seen = clean_stub.requests()
    assert [(e["path"], e["stream"]) for e in seen] == [("/v1/responses", False), ("/v1/responses", True)]
    for entry in seen:
        assert_swapped(entry, minted["token"], "authorization", clean_stub.openai_key)
    rows = settled(gateway, minted["key_id"], 2)
    assert [r["stream"] for r in rows] == [False, True]
    assert all(r["status"] == "completed" and r["usage"] == O_USAGE for r in rows)
    assert all(r["served_model"] == O_MODEL for r in rows)


EMBEDDINGS_ACCOUNT = """
[[account]]
id = "openai-embeddings"
provider_binding = "openai"
base_url = "{url}"
auth_style = "bearer"
credential_env = "GATEWAY_EMBEDDINGS_KEY"
models = ["text-embedding-*"]
"""


def test_openai_embeddings_and_models(make_gateway, tmp_path, clean_stub: Stub) -> None:
    """Embedding models are among legacy-openai's globs (SPEC §4: `text-embedding-*`), which comes
    first; a declared account serving them too is its sibling."""
    accounts = tmp_path / "accounts.toml"
    accounts.write_text(EMBEDDINGS_ACCOUNT.format(url=clean_stub.url))
    gateway = make_gateway(
        {"GATEWAY_ACCOUNTS_FILE": str(accounts), "GATEWAY_EMBEDDINGS_KEY": clean_stub.openai_key}
    ).start()
    status, _, minted = gateway.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": "d-embed",
            "repo_slug": "acme/app",
            "principal_kind": "worker",
            "principal_id": "w-1",
            "model": "text-embedding-3-small",
        },
    )
    assert (status, minted["account_id"]) == (201, "legacy-openai"), minted
    sdk = openai_sdk(gateway, minted["token"])
    embedded = sdk.embeddings.create(model="text-embedding-3-small", input=["a", "b"])
    assert len(embedded.data) == 2
    assert [m.id for m in sdk.models.list()] == list(OPENAI_MODELS)

    seen = clean_stub.requests()
    assert [(e["method"], e["path"]) for e in seen] == [("POST", "/v1/embeddings"), ("GET", "/v1/models")]
    for entry in seen:
        assert_swapped(entry, minted["token"], "authorization", clean_stub.openai_key)
    rows = settled(gateway, minted["key_id"], 2)
    assert rows[0]["usage"] == {
        "input_tokens": STUB_INPUT_TOKENS,
        "output_tokens": 0,
        "cache_read_tokens": 0,
        "cache_creation_tokens": 0,
    }
    assert rows[1]["usage"] is None


# ---- errors pass through, gateway errors in the wire's shape --------------------------------


UNKNOWN_TOKEN = "lhgw_01J00000000000000000000000.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"


@pytest.mark.parametrize("kind", ["unknown", "revoked"])
@pytest.mark.parametrize("endpoint", ["chat", "responses"])
def test_refused_key_on_the_openai_wire_is_401_do_not_retry(
    gateway: Gateway, clean_stub: Stub, kind: str, endpoint: str
) -> None:
    """SPEC §15: a 401 carries `x-should-retry: false` on the OpenAI wire too, in its shape."""
    token = UNKNOWN_TOKEN
    if kind == "revoked":
        minted = gateway.mint("openai")
        assert gateway.revoke(minted["key_id"]) is True
        token = minted["token"]
    sdk = openai_sdk(gateway, token)
    with pytest.raises(openai.AuthenticationError) as caught:
        if endpoint == "chat":
            sdk.chat.completions.create(model=O_MODEL, messages=MESSAGES)
        else:
            sdk.responses.create(model=O_MODEL, input="hi")
    got = caught.value.response.headers
    assert caught.value.status_code == 401 and got["x-should-retry"] == "false"
    assert got["x-request-id"].startswith("req_")
    body = caught.value.body
    assert body["code"] == "unknown-key" and body["type"] == "authentication_error"
    assert clean_stub.requests() == []


def test_upstream_429_headers_reach_both_sdks(gateway: Gateway, clean_stub: Stub) -> None:
    limits = {
        "retry-after": "7",
        "retry-after-ms": "6500",
        "x-should-retry": "true",
        "anthropic-ratelimit-requests-remaining": "0",
        "x-ratelimit-remaining-requests": "0",
    }
    a = gateway.mint()
    with pytest.raises(anthropic.RateLimitError) as caught:
        anthropic_sdk(gateway, a["token"]).messages.create(
            model=A_MODEL, max_tokens=5, messages=MESSAGES, extra_headers=step(status=429, headers=limits)
        )
    got = caught.value.response.headers
    assert {k: got[k] for k in limits} == limits
    assert got["request-id"].startswith("req_") and "x-leasehold-overhead-ms" in got

    o = gateway.mint("openai")
    with pytest.raises(openai.RateLimitError) as caught_o:
        openai_sdk(gateway, o["token"]).chat.completions.create(
            model=O_MODEL, messages=MESSAGES, extra_headers=step(status=429, headers=limits)
        )
    got = caught_o.value.response.headers
    assert {k: got[k] for k in limits} == limits and got["x-request-id"].startswith("req_")
    assert caught_o.value.code == "rate_limit_exceeded"  # the upstream's own body, unchanged

    for key_id in (a["key_id"], o["key_id"]):
        row = one_row(gateway, key_id)
        assert (row["status"], row["http_status"], row["condition"]) == ("upstream-error", 429, "rate-limited")
        assert row["refusal_reason"] is None and row["usage"] is None


def test_529_stays_529_and_a_400_is_not_evidence(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint()
    sdk = anthropic_sdk(gateway, minted["token"])
    with pytest.raises(anthropic.APIStatusError) as caught:
        sdk.messages.create(model=A_MODEL, max_tokens=5, messages=MESSAGES, extra_headers=step(status=529))
    assert caught.value.status_code == 529
    with pytest.raises(anthropic.BadRequestError):
        sdk.messages.create(model=A_MODEL, max_tokens=5, messages=MESSAGES, extra_headers=step(status=400))
    rows = settled(gateway, minted["key_id"], 2)
    assert [(r["http_status"], r["condition"]) for r in rows] == [(529, "overloaded"), (400, None)]
    assert all(r["first_byte_ms"] >= 0 and r["hop"] == 0 for r in rows)  # an error answer is an answer


@pytest.mark.parametrize(
    "binding,path,wire",
    [
        ("anthropic", "/v1/chat/completions", "anthropic"),
        ("openai", "/v1/messages", "openai"),
        ("openai", "/v2/whatever", "openai"),
    ],
)
def test_path_the_wire_does_not_serve_is_404_in_its_shape(
    gateway: Gateway, clean_stub: Stub, binding: str, path: str, wire: str
) -> None:
    minted = gateway.mint(binding)
    status, headers, body = call(
        "POST", gateway.dataplane_url + path, {"model": "m"}, {"authorization": f"Bearer {minted['token']}"}
    )
    assert status == 404
    row = one_row(gateway, minted["key_id"])
    if wire == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
        assert body["error"]["code"] == "path-not-served"
        assert headers["request-id"] == body["request_id"] == row["attempt_id"]
    else:
        assert set(body) == {"error"} and body["error"]["code"] == "path-not-served"
        assert body["error"]["type"] == "not_found_error" and body["error"]["param"] is None
        assert headers["x-request-id"] == row["attempt_id"]
    assert "x-leasehold-overhead-ms" in headers
    assert (row["status"], row["refusal_reason"], row["condition"]) == ("refused", "path-not-served", None)
    assert (row["first_byte_ms"], row["hop"]) == (None, 0)  # SPEC §14: refused, nothing sent upstream
    assert clean_stub.requests() == []


def test_websocket_upgrade_off_the_openai_wire_is_426(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint()  # SPEC §15: the OpenAI wire's /v1/responses is proxied (§20), not this
    status, headers, body = call(
        "GET",
        gateway.dataplane_url + "/v1/responses",
        None,
        {
            "authorization": f"Bearer {minted['token']}",
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        },
    )
    assert status == 426 and body["error"]["code"] == "websocket-not-supported"
    assert headers["x-request-id"]
    assert clean_stub.requests() == []


# ---- header rules ---------------------------------------------------------------------------


def test_key_header_precedence_and_both_always_stripped(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint()
    token = minted["token"]
    bogus = "lhgw_01J00000000000000000000000.BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"
    for headers in (
        {"x-api-key": token, "authorization": f"Bearer {bogus}"},
        {"x-api-key": bogus, "authorization": f"Bearer {token}"},
        {"x-api-key": "", "authorization": f"bearer {token}"},
    ):
        status, _, _ = call("POST", gateway.dataplane_url + "/v1/messages", A_BODY, {**A_HEADERS, **headers})
        assert status == 200, headers
    for entry in clean_stub.requests():
        assert_swapped(entry, token, "x-api-key", clean_stub.anthropic_key)
        assert bogus not in json.dumps(entry["headers"])
    settled(gateway, minted["key_id"], 3)


def test_end_to_end_headers_pass_and_hop_by_hop_do_not(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint()
    kept = {
        "x-stainless-timeout": "NOT_GIVEN",
        "x-app": "cli",
        "anthropic-beta": "a-2026-01-01,b-2026-02-02",
        "X-Claude-Code-Session-Id": "3b9c7a8e-0000-4000-8000-000000000000",
        "x-codex-turn-metadata": json.dumps({"k": "v" * 700}),
        "x-big": "z" * (16 * 1024 - 8),
        "anthropic-dangerous-direct-browser-access": "true",
    }
    hop = {
        "Connection": "keep-alive, x-hop-private",
        "x-hop-private": "1",
        "TE": "trailers",
        "Proxy-Authorization": "Basic c2VjcmV0",
        "Keep-Alive": "timeout=5",
    }
    answer = {"retry-after-ms": "10", "x-should-retry": "false", "anthropic-ratelimit-tokens-remaining": "99"}
    conn = http.client.HTTPConnection("127.0.0.1", gateway.dataplane_port, timeout=10)
    conn.request(
        "POST",
        "/v1/messages",
        json.dumps(A_BODY),
        {**A_HEADERS, **kept, **hop, "x-api-key": minted["token"], **step(headers=answer)},
    )
    response = conn.getresponse()
    response.read()
    conn.close()
    assert response.status == 200
    assert {k: response.headers[k] for k in answer} == answer
    seen = stub_entry(clean_stub)["headers"]
    assert {k.lower(): v for k, v in kept.items()} == {k.lower(): seen.get(k.lower()) for k in kept}
    for name in ("x-hop-private", "te", "proxy-authorization", "keep-alive"):
        assert name not in seen, name
    one_row(gateway, minted["key_id"])


def test_compressed_bodies_pass_through_untouched(gateway: Gateway, clean_stub: Stub) -> None:
    """A gzip request body is forwarded as it came; a gzip answer comes back still compressed."""
    minted = gateway.mint()
    body = gzip.compress(json.dumps({**A_BODY, "stream": True}).encode())
    request = urllib.request.Request(
        gateway.dataplane_url + "/v1/messages",
        data=body,
        method="POST",
        headers={
            **A_HEADERS,
            "content-encoding": "gzip",
            "accept-encoding": "gzip",
            "x-api-key": minted["token"],
            **step(gzip=True),
        },
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["content-encoding"] == "gzip"
        text = gzip.decompress(response.read()).decode()
    assert "event: message_stop" in text
    entry = stub_entry(clean_stub)
    assert entry["headers"]["content-encoding"] == "gzip" and entry["headers"]["accept-encoding"] == "gzip"
    assert entry["model"] == A_MODEL and entry["stream"] is True  # the stub inflated valid gzip
    row = one_row(gateway, minted["key_id"])
    assert row["requested_model"] == A_MODEL and row["stream"] is True
    assert row["status"] == "completed" and row["usage"] == A_USAGE  # read from an inflated copy
