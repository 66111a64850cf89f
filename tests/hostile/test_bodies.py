"""Bodies a hostile worker sends, on every path whose body names a model (SPEC §19).

Each case is posted with a lease held to `claude-haiku-*` (Anthropic wire) or `gpt-5-mini`
(OpenAI wire) and names a model its account does not serve in a way a lenient reader misses.
Each asserts the refusal (status, code, the wire's shape, `x-should-retry: false`), that the
upstream saw nothing, one `refused` row that is never evidence, and a healthy data plane after.
On main (the lenient peek) the first ones reached the upstream naming Opus.
"""

from __future__ import annotations

import gzip
import itertools
import json
import zlib
from typing import NamedTuple

import pytest

from tests.hostile.conftest import FULL, HAIKU, MINI, OPUS, dataplane_healthy, mint_v2, post_raw
from tests.support.attempts import A_HEADERS, settled
from tests.support.harness import Gateway, Stub

_ids = itertools.count(1)
A_PATHS = ("/v1/messages", "/v1/messages/count_tokens")
O_PATHS = ("/v1/chat/completions", "/v1/responses", "/v1/embeddings")


class Case(NamedTuple):
    name: str
    wire: str  # "anthropic" | "openai"
    body: bytes
    headers: dict[str, str]
    status: int
    code: str


def _a(model: str = OPUS) -> str:
    return json.dumps({"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})


def _o(model: str = FULL) -> str:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})


def _cases() -> list[Case]:
    cases: list[Case] = []
    for wire, good, bad, plain in (("anthropic", HAIKU, OPUS, _a), ("openai", MINI, FULL, _o)):
        body = plain(bad).encode()
        refuse = lambda name, b, h=None, s=400, c="invalid-request-body": cases.append(  # noqa: E731
            Case(f"{wire}: {name}", wire, b, h or {}, s, c)
        )
        refuse("a UTF-8 BOM", b"\xef\xbb\xbf" + body)
        refuse("an unpaired high surrogate", body[:-1] + b',"x":"\\ud800"}')
        refuse("an unpaired low surrogate in the model", plain(bad + "\\udc00").encode().replace(b"\\\\", b"\\"))
        refuse("NaN", body[:-1] + b',"temperature":NaN}')
        refuse("Infinity", body[:-1] + b',"temperature":-Infinity}')
        refuse("trailing data", body + b'{"model":"' + good.encode() + b'"}')
        refuse("trailing garbage", body + b"\x00")
        refuse("two models, the allowed one last", f'{{"model":"{bad}","model":"{good}"}}'.encode())
        refuse("two models, the allowed one first", f'{{"model":"{good}","model":"{bad}"}}'.encode())
        refuse("two models, one escaped", f'{{"model":"{good}","mod\\u0065l":"{bad}"}}'.encode())
        refuse("a model that is a list", f'{{"model":["{bad}"]}}'.encode())
        refuse("a null model", b'{"model":null}')
        refuse("an array of objects", b"[" + body + b"]")
        refuse("invalid UTF-8", body[:-1] + b',"x":"\xc3\x28"}')
        refuse("nesting 100000 deep", body[:-1] + b',"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}")
        refuse("UTF-16", plain(bad).encode("utf-16"))
        refuse("gzip of a BOM body", gzip.compress(b"\xef\xbb\xbf" + body), {"Content-Encoding": "gzip"})
        refuse("double gzip", gzip.compress(gzip.compress(body)), {"Content-Encoding": "gzip"})
        refuse("corrupt gzip", gzip.compress(body)[:-9] + b"garbage!!", {"Content-Encoding": "gzip"})
        refuse("gzip with trailing junk", gzip.compress(body) + b"junk", {"Content-Encoding": "gzip"})
        refuse("raw deflate", zlib.compressobj(wbits=-15).compress(body) + b"\x03\x00", {"Content-Encoding": "deflate"})
        refuse("brotli", body, {"Content-Encoding": "br"}, 415, "unsupported-content-encoding")
        refuse(
            "gzip, gzip",
            gzip.compress(gzip.compress(body)),
            {"Content-Encoding": "gzip, gzip"},
            415,
            "unsupported-content-encoding",
        )
        refuse(
            "a gzip bomb",
            gzip.compress(b'{"model":"' + good.encode() + b'","x":"' + b"a" * (40 << 20) + b'"}'),
            {"Content-Encoding": "gzip"},
            413,
            "body-too-large",
        )
        refuse(
            "a bomb of zeros", gzip.compress(b"\x00" * (40 << 20)), {"Content-Encoding": "gzip"}, 413, "body-too-large"
        )
    cases.append(
        Case(
            "openai: stream twice",
            "openai",
            b'{"model":"gpt-5-mini","stream":false,"stream":true,"messages":[]}',
            {},
            400,
            "invalid-request-body",
        )
    )
    cases.append(
        Case(
            "openai: include_usage twice",
            "openai",
            b'{"model":"gpt-5-mini","stream":true,"stream_options":{"include_usage":true,'
            b'"include_usage":false},"messages":[]}',
            {},
            400,
            "invalid-request-body",
        )
    )
    return cases


CASES = _cases()


def test_at_least_thirty_bodies() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_hostile_body_is_refused_and_never_sent(hgw: Gateway, clean_stub: Stub, case: Case) -> None:
    n = next(_ids)
    minted = mint_v2(hgw, HAIKU if case.wire == "anthropic" else MINI, f"d-body-{n}")
    paths = A_PATHS if case.wire == "anthropic" else O_PATHS
    path = paths[n % len(paths)]
    auth = (
        {**A_HEADERS, "x-api-key": minted["token"]}
        if case.wire == "anthropic"
        else {"authorization": f"Bearer {minted['token']}", "content-type": "application/json"}
    )
    status, headers, raw = post_raw(hgw, path, case.body, {**auth, **case.headers})
    answer = json.loads(raw)
    assert (status, answer["error"]["code"]) == (case.status, case.code), answer
    if case.wire == "anthropic":
        assert answer["type"] == "error" and headers["request-id"].startswith("att_")
    else:
        assert headers["x-request-id"].startswith("att_")
    if case.status != 413:
        assert headers["x-should-retry"] == "false"
    assert clean_stub.requests() == []
    row = settled(hgw, minted["key_id"])[0]
    assert (row["status"], row["http_status"], row["refusal_reason"], row["condition"]) == (
        "refused",
        case.status,
        case.code,
        None,
    )
    assert dataplane_healthy(hgw)


def test_a_body_with_no_model_is_forwarded(hgw: Gateway, clean_stub: Stub) -> None:
    minted = mint_v2(hgw, HAIKU, "d-body-none")
    status, _, _ = post_raw(
        hgw, "/v1/messages", b'{"max_tokens":8,"messages":[]}', {**A_HEADERS, "x-api-key": minted["token"]}
    )
    assert status == 200 and len(clean_stub.requests()) == 1


def test_the_body_goes_upstream_as_it_came(hgw: Gateway, clean_stub: Stub) -> None:
    """Strictly read, never rewritten: a gzip body with escapes reaches the upstream compressed."""
    minted = mint_v2(hgw, HAIKU, "d-body-same")
    body = (
        b'{"model":"claude-haiku-\\u0034-5", "max_tokens":8, "messages":[{"role":"user",'
        b'"content":"h\\u00e9 \\ud83d\\ude00 1e999"}]}'
    )
    status, _, _ = post_raw(
        hgw,
        "/v1/messages",
        gzip.compress(body),
        {**A_HEADERS, "x-api-key": minted["token"], "Content-Encoding": "gzip"},
    )
    assert status == 200
    entry = clean_stub.requests()[0]
    assert entry["headers"]["content-encoding"] == "gzip" and entry["model"] == HAIKU
    assert entry["body"] == body.decode()  # the stub (aiohttp) decoded it as the provider would
    assert settled(hgw, minted["key_id"])[0]["requested_model"] == HAIKU
