"""The lean upstream client against real sockets: the bytes it sends are aiohttp's, byte for
byte; connections are kept and reused; a stale one is retried only for an idempotent method;
malformed answers, refused connections and unverifiable TLS fail as the relay expects; a
request with `Expect` is handed to aiohttp."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from multidict import CIMultiDict
from yarl import URL

from dataplane import upstream_client
from dataplane.upstream_client import UpstreamClient
from tests.support.waits import until

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
Answer = Callable[[int, bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


class Upstream:
    """A raw HTTP/1.1 server: records each request's bytes and which connection carried it."""

    def __init__(self, answer: Answer | None = None) -> None:
        self.requests: list[tuple[int, bytes]] = []
        self.connections = 0
        self.hung_up = 0  # connections the client closed
        self.answer = answer or self.ok
        self.server: asyncio.AbstractServer | None = None

    @staticmethod
    async def ok(_conn: int, _raw: bytes, _reader, writer: asyncio.StreamWriter) -> bool:
        writer.write(OK)
        return True

    async def start(self, ssl_context: ssl.SSLContext | None = None) -> Upstream:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=ssl_context)
        return self

    @property
    def port(self) -> int:
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = self.connections
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                expects = b"expect: 100-continue" in head.lower()
                if expects:
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                body = await reader.readexactly(length) if length else b""
                self.requests.append((conn, head + body))
                if not await self.answer(conn, head + body, reader, writer):
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.hung_up += 1
        finally:
            writer.close()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def aiohttp_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
        auto_decompress=False,
        skip_auto_headers=frozenset({"User-Agent", "Accept", "Accept-Encoding", "Content-Type"}),
        timeout=aiohttp.ClientTimeout(total=None),
    )


def client() -> UpstreamClient:
    return UpstreamClient(5.0, aiohttp_session)


async def exchange(
    c: UpstreamClient, method: str, url: URL, headers: CIMultiDict[str], body: bytes | None
) -> tuple[int, bytes]:
    response = await c.request(method, url, headers, body)
    payload = await response.read()
    response.release()
    return response.status, payload


CASES = [
    (
        "POST",
        "/v1/messages?beta=true",
        [
            ("anthropic-version", "2023-06-01"),
            ("x-api-key", "CRED"),
            ("Content-Type", "application/json"),
            ("x-extra", "a"),
            ("X-Extra", "b"),
        ],
        b'{"model":"m"}',
    ),
    ("POST", "/v1/messages/count_tokens", [("Authorization", "Bearer CRED")], None),
    ("GET", "/v1/models", [("Authorization", "Bearer CRED"), ("Accept", "application/json")], None),
    ("POST", "/v1/chat/completions", [("Content-Encoding", "gzip")], b"\x1f\x8b" + b"z" * 70_000),
    ("POST", "/v1/responses", [("x-dup", "1"), ("x-dup", "2"), ("X-Dup", "3"), ("x-dup", "4")], b"{}"),
    ("POST", "/v1/responses", [("x-dup", "1"), ("x-dup", "2")], b"{}"),  # same spelling: both kept
    ("GET", "/v1/models", [("host", "example.test"), ("Accept", "*/*")], None),  # replaces the URL's
    ("GET", "/v1/models", [("Host", "example.test")], None),  # the same spelling as the URL's
    ("POST", "/v1/messages", [("x-title", "caf\u00e9 \u2603 \U0001f600"), ("x-tab", "a\tb")], b"{}"),
]


@pytest.mark.parametrize(
    "method,path,headers,body",
    CASES,
    ids=["post", "post-empty", "get", "big-body", "repeated", "repeated-same", "host", "host-same", "utf8"],
)
async def test_request_bytes_are_aiohttps(method: str, path: str, headers: list, body: bytes | None) -> None:
    upstream = await Upstream().start()
    lean, session = client(), aiohttp_session()
    try:
        url = URL(f"http://127.0.0.1:{upstream.port}{path}", encoded=True)
        assert (await exchange(lean, method, url, CIMultiDict(headers), body)) == (200, b"{}")
        async with session.request(
            method, url, data=body, headers=CIMultiDict(headers), allow_redirects=False
        ) as theirs:
            await theirs.read()
        (_, ours), (_, reference) = upstream.requests
        assert ours == reference
    finally:
        await lean.close()
        await session.close()
        upstream.close()


async def test_connections_are_kept_and_reused() -> None:
    upstream = await Upstream().start()
    lean = client()
    try:
        url = URL(f"http://127.0.0.1:{upstream.port}/v1/messages", encoded=True)
        for _ in range(3):
            assert (await exchange(lean, "POST", url, CIMultiDict(), b"{}"))[0] == 200
        assert upstream.connections == 1
    finally:
        await lean.close()
        upstream.close()


@pytest.mark.parametrize("past", [b"", b"\r\n", b"HTTP/1.1 418 I", b"HTTP/1.1 200 OK\r\nX-Smuggled: 1\r\nConte"])
async def test_bytes_past_an_answer_never_prefix_the_next(past: bytes) -> None:
    """An upstream writing past its answer on a kept-alive connection (a partial next head in the
    same write): the next exchange on that connection reads only its own answer, as with a
    fresh parser (the response parser is kept across exchanges only between messages)."""
    second = b"HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\nnext"

    async def answer(_conn: int, _raw: bytes, _reader, writer: asyncio.StreamWriter) -> bool:
        writer.write(OK + past if len(upstream.requests) == 1 else second)
        return True

    upstream = await Upstream(answer).start()
    lean = client()
    try:
        url = URL(f"http://127.0.0.1:{upstream.port}/v1/messages", encoded=True)
        assert await exchange(lean, "POST", url, CIMultiDict(), b"{}") == (200, b"{}")
        assert await exchange(lean, "POST", url, CIMultiDict(), b"{}") == (201, b"next")
        assert await exchange(lean, "POST", url, CIMultiDict(), b"{}") == (201, b"next")
        assert upstream.connections == 1
    finally:
        await lean.close()
        upstream.close()


async def test_connections_unused_for_the_keepalive_time_are_closed(monkeypatch) -> None:
    monkeypatch.setattr(upstream_client, "KEEPALIVE_S", 0.05)
    upstream = await Upstream().start()
    lean = client()
    try:
        url = URL(f"http://127.0.0.1:{upstream.port}/v1/messages", encoded=True)
        assert (await exchange(lean, "POST", url, CIMultiDict(), b"{}"))[0] == 200
        await until(lambda: upstream.hung_up >= 1, 5, "the idle connection closed")
        assert (await exchange(lean, "POST", url, CIMultiDict(), b"{}"))[0] == 200
        assert upstream.connections == 2  # the first was closed, not reused
    finally:
        await lean.close()
        upstream.close()


@pytest.mark.parametrize("method,retried", [("GET", True), ("POST", False)])
async def test_a_stale_connection_is_retried_only_for_an_idempotent_method(method: str, retried: bool) -> None:
    async def answer(conn: int, _raw: bytes, _reader, writer: asyncio.StreamWriter) -> bool:
        if conn == 1 and len(upstream.requests) == 2:
            return False  # the second request on the first connection: closed unanswered
        writer.write(OK)
        return True

    upstream = await Upstream(answer).start()
    lean = client()
    try:
        url = URL(f"http://127.0.0.1:{upstream.port}/v1/models", encoded=True)
        assert (await exchange(lean, method, url, CIMultiDict(), None))[0] == 200
        if retried:
            assert (await exchange(lean, method, url, CIMultiDict(), None))[0] == 200
            assert [conn for conn, _ in upstream.requests] == [1, 1, 2]
        else:
            with pytest.raises(aiohttp.ServerDisconnectedError):
                await exchange(lean, method, url, CIMultiDict(), None)
            assert [conn for conn, _ in upstream.requests] == [1, 1]
    finally:
        await lean.close()
        upstream.close()


async def test_a_malformed_answer_is_a_client_response_error() -> None:
    async def answer(_conn: int, _raw: bytes, _reader, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 abc nonsense\r\n\r\n")
        return False

    upstream = await Upstream(answer).start()
    lean = client()
    try:
        url = URL(f"http://127.0.0.1:{upstream.port}/v1/messages", encoded=True)
        with pytest.raises(aiohttp.ClientResponseError):
            await lean.request("POST", url, CIMultiDict(), b"{}")
    finally:
        await lean.close()
        upstream.close()


async def test_interim_answers_are_skipped() -> None:
    async def answer(_conn: int, _raw: bytes, _reader, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + OK)
        return True

    upstream = await Upstream(answer).start()
    lean = client()
    try:
        url = URL(f"http://127.0.0.1:{upstream.port}/v1/messages", encoded=True)
        assert await exchange(lean, "POST", url, CIMultiDict(), b"{}") == (200, b"{}")
    finally:
        await lean.close()
        upstream.close()


async def test_a_refused_connection_is_an_os_error() -> None:
    probe = await Upstream().start()
    port = probe.port
    probe.close()
    await probe.server.wait_closed()
    lean = client()
    try:
        with pytest.raises(OSError):
            await lean.request("POST", URL(f"http://127.0.0.1:{port}/v1/messages"), CIMultiDict(), b"{}")
    finally:
        await lean.close()


async def test_expect_is_handed_to_aiohttp() -> None:
    upstream = await Upstream().start()
    lean = client()
    try:
        url = URL(f"http://127.0.0.1:{upstream.port}/v1/messages", encoded=True)
        response = await lean.request("POST", url, CIMultiDict({"Expect": "100-continue"}), b"{}")
        assert isinstance(response, aiohttp.ClientResponse)
        assert response.status == 200 and await response.read() == b"{}"
        response.release()
    finally:
        await lean.close()
        upstream.close()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_tls_is_verified_and_used(certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(cert, key)
    upstream = await Upstream().start(server_side)
    url = URL(f"https://localhost:{upstream.port}/v1/messages", encoded=True)
    default = client()
    trusting_context = ssl.create_default_context(cafile=str(cert))
    trusting = UpstreamClient(5.0, aiohttp_session, tls=trusting_context)
    try:
        with pytest.raises(ssl.SSLCertVerificationError):  # an OSError: "upstream unreachable"
            await default.request("POST", url, CIMultiDict(), b"{}")
        assert await exchange(trusting, "POST", url, CIMultiDict(), b"{}") == (200, b"{}")
        assert upstream.requests[-1][1].startswith(b"POST /v1/messages HTTP/1.1\r\nHost: localhost:")
    finally:
        await default.close()
        await trusting.close()
        upstream.close()
