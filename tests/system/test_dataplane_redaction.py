"""Redaction by value (issue 3 item 2): the live credentials and the presented key never reach a
log line, a file or the upstream, even when they match no known secret shape."""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

from tests.support.attempts import A_BODY, A_HEADERS, assert_swapped, settled, step, stub_entry
from tests.support.harness import Stub
from tests.support.harness import http as call
from tests.support.waits import wait_until


def shapeless(prefix: str) -> str:
    """A secret no shape rule knows: only redaction by value can catch it."""
    return prefix + secrets.token_hex(20)


def every_file_text(root: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in root.rglob("*") if p.is_file())


def test_credentials_and_presented_keys_never_recorded(make_gateway, tmp_path: Path) -> None:
    anthropic_key, openai_key = shapeless("Acred"), shapeless("Ocred")
    upstream = Stub(tmp_path / "stub", anthropic_key=anthropic_key, openai_key=openai_key)
    try:
        gw = make_gateway(upstream=upstream).start()
        minted, revoked = gw.mint(), gw.mint()
        gw.revoke(revoked["key_id"])
        guessed = [shapeless("hunter"), anthropic_key, openai_key, revoked["token"], revoked["token"].split(".")[1]]

        # Served: the credential is swapped in; the key in the query string is dropped too.
        status, _, _ = call(
            "POST",
            gw.dataplane_url + f"/v1/messages?beta=true&key={minted['token']}",
            A_BODY,
            {**A_HEADERS, "x-api-key": minted["token"]},
        )
        assert status == 200
        entry = stub_entry(upstream)
        assert entry["path"] == "/v1/messages?beta=true"
        assert_swapped(entry, minted["token"], "x-api-key", anthropic_key)
        # The upstream rejects the credential: its answer passes through, nothing is logged of it.
        status, _, _ = call(
            "POST",
            gw.dataplane_url + "/v1/messages",
            A_BODY,
            {**A_HEADERS, "x-api-key": minted["token"], **step(status=401)},
        )
        assert status == 401
        # Failed authentications: each presented string is refused and never written anywhere.
        for presented in guessed:
            for header in ({"x-api-key": presented}, {"authorization": f"Bearer {presented}"}):
                status, headers, _ = call("POST", gw.dataplane_url + "/v1/messages", A_BODY, {**A_HEADERS, **header})
                assert status == 401 and headers["x-should-retry"] == "false"
        # A header line too long to parse, beginning with a live credential and with the presented
        # key: the refusal is logged (by its reason: on aiohttp, with the start of the offending
        # value, scrubbed by redaction; on shared/http1, with no byte of the request).
        for value in (anthropic_key, minted["token"]):
            with socket.create_connection(("127.0.0.1", gw.dataplane_port), timeout=5) as sock:
                sock.sendall(
                    b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: "
                    + value.encode()
                    + b"a" * 40_000
                    + b"\r\n\r\n"
                )
                assert sock.recv(4096).split(b"\r\n", 1)[0].endswith(b"400 Bad Request")
        settled(gw, minted["key_id"], 2)
        wait_until(lambda: gw.logs().count('"field-too-long"') >= 2, 10, "the parser's complaints logged")
        for entry in upstream.requests():
            values = " ".join(entry["headers"].values()) + entry["path"]
            assert minted["token"] not in values and "lhgw_" not in values
            assert not any(g in values for g in guessed if g not in (anthropic_key, openai_key))
        gw.stop()
    finally:
        upstream.stop()

    recorded = gw.logs() + every_file_text(gw.state_dir) + every_file_text(gw.runtime_dir)
    assert recorded.count('"field-too-long"') >= 2  # the parser's complaints are there, without the value
    for secret in (anthropic_key, openai_key, minted["token"], minted["token"].split(".")[1], *guessed):
        assert secret not in recorded, secret
