"""Large bodies through a real data plane: read in a reader process, as strictly (SPEC §19).

A body of `OFF_LOOP_BYTES` or more is read in a reader process the data plane starts at its
first large body (none at start, none for small bodies: an idle data plane's RSS is unchanged),
replaces when one dies, and stops with itself. The body still goes upstream byte for byte.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from dataplane.bodies import OFF_LOOP_BYTES
from tests.hostile.conftest import HAIKU, MINI, OPUS, mint_v2, post_raw, start_hostile_gateway
from tests.hostile.test_usage_asked import UPSTREAM, WITHOUT_USAGE_CHUNK
from tests.support.attempts import A_HEADERS, step
from tests.support.harness import Gateway, Stub
from tests.support.waits import wait_until

TEXT = "The reader reads this. " * (OFF_LOOP_BYTES // 8)  # ~3 x the threshold


def _body(model: str, text: str = TEXT) -> bytes:
    return json.dumps({"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": text}]}).encode()


def _children(pid: int) -> list[int]:
    """The live (not zombie) processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue
        if int(ppid) == pid and state != "Z":
            found.append(int(entry.name))
    return found


def _readers(gw: Gateway) -> list[int]:
    return _children(gw.dataplane.popen.pid)  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def lgw(tmp_path_factory: pytest.TempPathFactory, stub: Stub) -> Iterator[Gateway]:
    gateway = start_hostile_gateway(tmp_path_factory.mktemp("large"), stub)
    yield gateway
    gateway.stop()


def _post(gw: Gateway, body: bytes, token: str, gzipped: bool = False) -> tuple[int, dict[str, str], bytes]:
    headers = {**A_HEADERS, "x-api-key": token}
    if gzipped:
        headers["Content-Encoding"] = "gzip"
        body = gzip.compress(body)
    return post_raw(gw, "/v1/messages", body, headers, timeout_s=60)


def test_no_reader_process_at_start_nor_for_small_bodies(lgw: Gateway, clean_stub: Stub) -> None:
    assert _readers(lgw) == []
    token = mint_v2(lgw, HAIKU, "d-large-small")["token"]
    small = _body(HAIKU, "hi")
    assert _post(lgw, small, token)[0] == 200
    assert _post(lgw, small, token, gzipped=True)[0] == 200
    assert _post(lgw, small[:-1] + b',"model":"x"}', token)[0] == 400
    assert _readers(lgw) == []


def test_a_large_body_is_read_by_a_reader_and_goes_upstream_byte_for_byte(lgw: Gateway, clean_stub: Stub) -> None:
    token = mint_v2(lgw, HAIKU, "d-large-same")["token"]
    body = _body(HAIKU)
    assert len(body) >= OFF_LOOP_BYTES
    for gzipped in (False, True):
        clean_stub.reset()
        status, _, answer = _post(lgw, body, token, gzipped)
        assert status == 200, answer[:300]
        (entry,) = clean_stub.requests()
        assert (entry["body_len"], entry["body_crc32"], entry["model"]) == (len(body), zlib.crc32(body), HAIKU)
        assert entry["headers"].get("content-encoding") == ("gzip" if gzipped else None)
    (reader,) = _readers(lgw)
    assert b"serve_reader" in Path(f"/proc/{reader}/cmdline").read_bytes()


@pytest.mark.parametrize(
    "name, body, status, code",
    [
        ("a model the lease does not serve", _body(OPUS), 400, "model-not-permitted"),
        ("the allowed model last", _body(OPUS)[:-1] + f',"model":"{HAIKU}"}}'.encode(), 400, "invalid-request-body"),
        ("a UTF-8 BOM", b"\xef\xbb\xbf" + _body(OPUS), 400, "invalid-request-body"),
        ("trailing data", _body(OPUS) + _body(HAIKU), 400, "invalid-request-body"),
        ("invalid UTF-8 at the end", _body(HAIKU)[:-2] + b'\xff"}', 400, "invalid-request-body"),
    ],
)
def test_a_large_hostile_body_is_refused_as_a_small_one(
    lgw: Gateway, clean_stub: Stub, name: str, body: bytes, status: int, code: str
) -> None:
    token = mint_v2(lgw, HAIKU, f"d-large-{name}")["token"]
    for gzipped in (False, True):
        got, headers, answer = _post(lgw, body, token, gzipped)
        assert (got, json.loads(answer)["error"]["code"] if got >= 400 else None) == (status, code), answer[:300]
        assert headers.get("x-should-retry") == "false"
    assert clean_stub.requests() == []


def test_a_large_chat_stream_is_asked_for_usage_by_way_of_a_reader(lgw: Gateway, clean_stub: Stub) -> None:
    """Its `stream_options` is found by a scan of the top level, in a reader process (SPEC §19)."""
    token = mint_v2(lgw, MINI, "d-large-usage")["token"]
    body = (
        b'{"model":"gpt-5-mini","stream":true,"messages":[{"role":"user","content":"'
        + TEXT.encode()
        + b'"}],"stream_options":{"include_usage":false}}'
    )
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json", **step(body=UPSTREAM)}
    for gzipped in (False, True):
        clean_stub.reset()
        sent = gzip.compress(body) if gzipped else body
        extra = {"content-encoding": "gzip"} if gzipped else {}
        status, _, received = post_raw(lgw, "/v1/chat/completions", sent, {**headers, **extra}, timeout_s=60)
        assert status == 200 and received.decode() == WITHOUT_USAGE_CHUNK
        (entry,) = clean_stub.requests()
        asked = body.replace(b'"include_usage":false}}', b'"include_usage":true}}')
        assert (entry["body_len"], entry["body_crc32"]) == (len(asked), zlib.crc32(asked))
        assert "content-encoding" not in entry["headers"]


def test_a_reader_killed_is_replaced_and_the_next_body_read(lgw: Gateway, clean_stub: Stub) -> None:
    token = mint_v2(lgw, HAIKU, "d-large-killed")["token"]
    assert _post(lgw, _body(HAIKU), token)[0] == 200
    (reader,) = _readers(lgw)
    os.kill(reader, signal.SIGKILL)
    wait_until(lambda: reader not in _readers(lgw), 30, "the killed reader is gone")
    status, _, answer = _post(lgw, _body(HAIKU), token)
    assert status == 200, answer[:300]
    (fresh,) = _readers(lgw)
    assert fresh != reader


def test_the_reader_stops_with_its_data_plane(tmp_path: Path, stub: Stub) -> None:
    gw = start_hostile_gateway(tmp_path, stub)
    try:
        token = mint_v2(gw, HAIKU, "d-large-stop")["token"]
        assert _post(gw, _body(HAIKU), token)[0] == 200
        (reader,) = _readers(gw)
    finally:
        gw.stop()
    wait_until(lambda: _alive([reader]) == [], 30, "the reader exits with its data plane")
    assert "Traceback" not in gw.logs()


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if state != "Z":
            alive.append(pid)
    return alive
