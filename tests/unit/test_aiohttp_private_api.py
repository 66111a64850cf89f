"""aiohttp's private parts the data plane is built on are still there and still behave as it
relies on, and only `dataplane/aiohttp_private.py` (the guard module) touches them; a failure
names the installed aiohttp version.

The upstream client writes its request head with `aiohttp.http_writer._serialize_headers` and
reads the answer with `aiohttp.client_proto.ResponseHandler` (plus `aiohttp.helpers`'
`EMPTY_BODY_METHODS` and `parse_content_type`); the WebSocket's connection handler, given a
connection `shared.http1` accepted (`hand_over`), is built from `web.Server._loop` / `._kwargs`. None of them is public API, so setup.cfg pins the aiohttp minors the byte-identity tests
(`tests/integration/test_upstream_client.py`) passed on; this file is the first thing to fail when
a new aiohttp moves them. Each check drives the part the way the data plane does, over a
transport that only records (no socket), or a server on 127.0.0.1."""

from __future__ import annotations

import ast
import asyncio
import inspect
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict

from dataplane.aiohttp_private import RESPONSE_PARAMS as KEPT_PARAMS
from dataplane.aiohttp_private import KeptAlive, hand_over, handed_over_server, server_class

REPO = Path(__file__).resolve().parents[2]
GUARD = REPO / "dataplane" / "aiohttp_private.py"
# aiohttp's public surface: the package and its `web` module (each one's `__all__`).
PUBLIC_MODULES = {"aiohttp", "aiohttp.web"}

# The keyword arguments the upstream client passes to `ResponseHandler.set_response_params`.
RESPONSE_PARAMS: dict[str, Any] = dict(skip_payload=False, **KEPT_PARAMS)


class _Transport(asyncio.Transport):
    """What a ResponseHandler is connected to: records writes, closes on request."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def write(self, data: bytes) -> None:  # the client writes through it; nothing to answer
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


async def connected(answer: bytes = b"", **changes: Any) -> Any:
    """A ResponseHandler as the client makes one (`ResponseHandler(loop)`), fed `answer`."""
    from aiohttp.client_proto import ResponseHandler

    protocol = ResponseHandler(asyncio.get_running_loop())
    protocol.connection_made(_Transport())
    protocol.set_response_params(**{**RESPONSE_PARAMS, **changes})
    if answer:
        protocol.data_received(answer)
    return protocol


# ---- the checks -------------------------------------------------------------------------------


async def serialize_headers_returns_the_exact_head() -> None:
    from aiohttp.http_writer import _serialize_headers

    headers = CIMultiDict(
        [("Host", "127.0.0.1:9"), ("x-api-key", "CRED"), ("X-Dup", "1"), ("x-dup", "2"), ("Content-Length", "2")]
    )
    assert _serialize_headers("POST /v1/messages?beta=true HTTP/1.1", headers) == (
        b"POST /v1/messages?beta=true HTTP/1.1\r\nHost: 127.0.0.1:9\r\nx-api-key: CRED\r\n"
        b"X-Dup: 1\r\nx-dup: 2\r\nContent-Length: 2\r\n\r\n"
    )


async def serialize_headers_refuses_cr_lf() -> None:
    from aiohttp.http_writer import _serialize_headers

    for headers in ([("x-a", "v\r\nInjected: 1")], [("x-a\n", "v")]):
        with pytest.raises(ValueError):
            _serialize_headers("GET / HTTP/1.1", CIMultiDict(headers))


async def response_handler_takes_the_clients_parameters() -> None:
    from aiohttp.client_proto import ResponseHandler

    inspect.signature(ResponseHandler.set_response_params).bind(None, **RESPONSE_PARAMS)
    protocol = await connected()
    assert protocol.is_connected() and not protocol.should_close and protocol.transport is not None
    protocol.close()
    assert not protocol.is_connected()


async def response_handler_reads_a_keep_alive_answer() -> None:
    protocol = await connected(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
    message, payload = await asyncio.wait_for(protocol.read(), 5)
    assert (message.code, message.reason, message.headers["Content-Type"]) == (201, "Created", "application/json")
    assert isinstance(payload, aiohttp.StreamReader)
    assert await asyncio.wait_for(payload.read(), 5) == b"{}" and payload.is_eof()
    assert not protocol.should_close and protocol.is_connected()


async def response_handler_reads_1xx_then_the_answer() -> None:
    protocol = await connected(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
    )
    first, _ = await asyncio.wait_for(protocol.read(), 5)
    second, payload = await asyncio.wait_for(protocol.read(), 5)
    assert (first.code, second.code) == (100, 200)
    assert await asyncio.wait_for(payload.read(), 5) == b"{}"


async def response_handler_marks_a_closing_answer() -> None:
    protocol = await connected(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
    await asyncio.wait_for(protocol.read(), 5)
    assert protocol.should_close


async def response_handler_skips_the_payload_when_told() -> None:
    protocol = await connected(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", skip_payload=True)
    _, payload = await asyncio.wait_for(protocol.read(), 5)
    assert payload.is_eof() and await payload.read() == b""


async def response_handler_raises_http_processing_error_on_a_malformed_answer() -> None:
    from aiohttp.http_exceptions import HttpProcessingError

    protocol = await connected(b"HTTP/1.1 2x0 OK\r\n\r\n")
    with pytest.raises(HttpProcessingError) as caught:
        await asyncio.wait_for(protocol.read(), 5)
    assert isinstance(caught.value.code, int) and isinstance(caught.value.message, str)
    assert hasattr(caught.value, "headers") and protocol.should_close


async def response_handler_raises_server_disconnected_on_a_lost_connection() -> None:
    from aiohttp.client_exceptions import ServerDisconnectedError

    protocol = await connected()
    protocol.connection_lost(None)
    with pytest.raises(ServerDisconnectedError):
        await asyncio.wait_for(protocol.read(), 5)


ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
HEAD_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"  # (to a HEAD: no body follows)
# What may follow an answer on a kept-alive connection, each read by a kept parser and by a
# fresh one (`KeptAlive`): the next answer in every framing, after stray CR/LFs, split anywhere,
# and garbage; the 1xx before it.
NEXT_ANSWERS = [
    ANSWER,
    b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\n\r\n2\r\nab\r\n0\r\nX-T: 1\r\n\r\n",
    b"HTTP/1.1 204 No Content\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end",
    b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx",
    b"HTTP/1.1 100 Continue\r\n\r\n" + ANSWER,
    b"\r\n" + ANSWER,
    b"\n\r\n\r" + ANSWER,
    b" " + ANSWER,
    b"HTTP/1.1 2x0 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    b"HTTP/1.1 200 OK\r\nX: a\x00b\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nraw",
    b"HTTP/1.1 200 OK\r\n" + b"X-Long: " + b"v" * (64 * 1024 + 1) + b"\r\n\r\n",
]


async def _read_all(protocol: Any, data: bytes, split: int) -> list[Any]:
    """What `protocol` reads from `data` (fed in two pieces at `split`): each answer's status,
    headers and body, or the error, and the connection's state after."""
    seen: list[Any] = []
    for piece in (data[:split], data[split:]):
        if piece and not protocol.transport.is_closing():  # (closed on a parse error: no more bytes)
            protocol.data_received(piece)
    protocol.connection_lost(None)  # the end: what is left is read to it
    while True:
        try:
            message, payload = await asyncio.wait_for(protocol.read(), 5)
        except Exception as exc:
            seen.append((type(exc).__name__, str(exc)))
            break
        try:
            body = await asyncio.wait_for(payload.read(), 5)
        except Exception as exc:
            body = (type(exc).__name__, str(exc))
        seen.append((message.code, message.reason, list(message.raw_headers), message.should_close, body))
    return seen


async def kept_alive_parser_reads_the_next_answer_as_a_fresh_one() -> None:
    """`KeptAlive.expect_response` keeps the parser after a clean answer; the next answer (any
    framing, split anywhere, or malformed) reads exactly as with the fresh parser aiohttp's
    `set_response_params` builds."""
    for skip in (False, True):
        for following in NEXT_ANSWERS:
            for split in sorted({0, 1, 2, 17, len(following) // 2, len(following) - 1}):
                seen = []
                for keep in (True, False):
                    protocol = KeptAlive(asyncio.get_running_loop())
                    protocol.connection_made(_Transport())
                    protocol.expect_response(skip)
                    first = protocol._parser
                    protocol.data_received(HEAD_ANSWER if skip else ANSWER)
                    _, payload = await asyncio.wait_for(protocol.read(), 5)
                    await payload.read()
                    assert not protocol.should_close
                    if keep:
                        protocol.expect_response(skip)
                        assert protocol._parser is first  # kept
                    else:
                        protocol.set_response_params(skip_payload=skip, **KEPT_PARAMS)
                    seen.append(await _read_all(protocol, following, split))
                assert seen[0] == seen[1], (skip, following[:40], split)


async def kept_alive_parser_is_dropped_when_it_holds_a_next_message() -> None:
    """Bytes past a clean answer (an upstream writing more than it answered) leave the parser in
    a next message: `expect_response` builds a fresh one, as aiohttp would, and the bytes are
    dropped with the old; CR/LF alone leave it between messages (and kept). A parser built for
    another `skip_payload`, or a connection not clean, is never kept."""
    loop = asyncio.get_running_loop()
    for extra, kept in [
        (b"", True),
        (b"\r\n", True),
        (b"\r", True),
        (b"H", False),
        (b"HTTP/1.1 200", False),
        (b"HTTP/1.1 200 OK\r\nContent-Le", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", None),  # a whole head: queued, not clean
    ]:
        for together in (True, False):
            protocol = KeptAlive(loop)
            protocol.connection_made(_Transport())
            protocol.expect_response(False)
            first = protocol._parser
            if together:
                protocol.data_received(ANSWER + extra)
            else:
                protocol.data_received(ANSWER)
            message, payload = await asyncio.wait_for(protocol.read(), 5)
            assert await payload.read() == b"{}"
            if not together and extra:
                protocol.data_received(extra)
            if kept is None:
                assert protocol.should_close
                continue
            assert not protocol.should_close, extra
            protocol.expect_response(False)
            assert (protocol._parser is first) is kept, (extra, together)
            protocol.data_received(ANSWER)
            message, payload = await asyncio.wait_for(protocol.read(), 5)
            assert (message.code, await payload.read()) == (200, b"{}"), extra
    protocol = KeptAlive(loop)
    protocol.connection_made(_Transport())
    protocol.expect_response(False)
    protocol.data_received(ANSWER)
    await (await asyncio.wait_for(protocol.read(), 5))[1].read()
    protocol.data_received(b"xyz")  # no message: the parser fails, the connection is not clean
    assert protocol.should_close
    protocol = KeptAlive(loop)
    protocol.connection_made(_Transport())
    protocol.expect_response(False)
    first = protocol._parser
    protocol.data_received(ANSWER)
    await (await asyncio.wait_for(protocol.read(), 5))[1].read()
    protocol.expect_response(True)  # another setting: a fresh parser
    assert protocol._parser is not first and protocol.parser_skips is True
    first = protocol._parser
    protocol.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")  # (a HEAD's answer)
    await asyncio.wait_for(protocol.read(), 5)
    protocol.expect_response(True)
    assert protocol._parser is first
    protocol.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")
    message, payload = await asyncio.wait_for(protocol.read(), 5)
    assert payload.is_eof() and not protocol.should_close  # still a HEAD's parser: no body awaited
    protocol.force_close()
    assert protocol.should_close
    protocol.expect_response(True)  # a connection not clean: never kept (the client does not reuse it)
    assert protocol._parser is not first


async def helpers_are_as_the_client_uses_them() -> None:
    from aiohttp.helpers import EMPTY_BODY_METHODS, parse_content_type

    assert "HEAD" in EMPTY_BODY_METHODS and "POST" not in EMPTY_BODY_METHODS
    assert parse_content_type("application/json; charset=utf-8")[0] == "application/json"


async def server_class_serves_with_the_given_handler() -> None:
    """`server_class(handler)` answers through `handler`, built with aiohttp's own arguments."""
    built: list[web.RequestHandler] = []

    class Counted(web.RequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    async def handle(_request: web.BaseRequest) -> web.StreamResponse:
        return web.Response(text="ok")

    server = server_class(Counted)(handle, handler_cancellation=True, max_field_size=8190)
    assert server._kwargs == {"max_field_size": 8190}  # what `__call__` passes on
    runner = web.ServerRunner(server, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/") as got:
            assert (got.status, await got.text()) == (200, "ok")
        assert len(built) == 1 and isinstance(built[0], Counted)
    finally:
        await runner.cleanup()


async def a_handed_over_connection_is_served_by_aiohttp() -> None:
    """`hand_over`: a connection another protocol accepted (its reading paused, as
    `shared.http1` hands one over) is served by aiohttp from the bytes given, then from the
    socket; the close is reported to `lost`."""
    loop = asyncio.get_running_loop()
    lost: asyncio.Future[Exception | None] = loop.create_future()

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        return web.Response(text=request.path)

    aiohttp_server = handed_over_server(handle, 1024, 8190)

    class Accepting(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            transport.pause_reading()  # type: ignore[attr-defined]
            hand_over(aiohttp_server, transport, b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n", lost.set_result)

    listener = await loop.create_server(Accepting, "127.0.0.1", 0)
    try:
        port = listener.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /second HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert answer.count(b"HTTP/1.1 200 OK") == 2 and answer.endswith(b"/second"), answer
        assert b"/first" in answer
        assert await asyncio.wait_for(lost, 10) is None  # the close, reported
    finally:
        listener.close()


class Case(NamedTuple):
    name: str
    given: Callable[[], Awaitable[None]]


CASES = [
    Case(check.__name__.replace("_", " "), check)
    for check in (
        serialize_headers_returns_the_exact_head,
        serialize_headers_refuses_cr_lf,
        response_handler_takes_the_clients_parameters,
        response_handler_reads_a_keep_alive_answer,
        response_handler_reads_1xx_then_the_answer,
        response_handler_marks_a_closing_answer,
        response_handler_skips_the_payload_when_told,
        response_handler_raises_http_processing_error_on_a_malformed_answer,
        response_handler_raises_server_disconnected_on_a_lost_connection,
        kept_alive_parser_reads_the_next_answer_as_a_fresh_one,
        kept_alive_parser_is_dropped_when_it_holds_a_next_message,
        helpers_are_as_the_client_uses_them,
        server_class_serves_with_the_given_handler,
        a_handed_over_connection_is_served_by_aiohttp,
    )
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
async def test_aiohttp_private_api(case: Case) -> None:
    try:
        await case.given()
    except (Exception, pytest.fail.Exception) as exc:  # any change at all is the news
        pytest.fail(
            f"aiohttp {aiohttp.__version__}: {case.name}: no longer holds ({type(exc).__name__}: {exc}). "
            "dataplane/aiohttp_private.py relies on it; run tests/integration/test_upstream_client.py "
            "and adjust the guard module and the aiohttp pin in setup.cfg together.",
            pytrace=True,
        )


def _from_aiohttp(base: ast.expr) -> bool:
    """`web.X` or `aiohttp.X`: a class of aiohttp's."""
    return isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id in ("web", "aiohttp")


def _private_members(cls: ast.ClassDef) -> set[str]:
    """The single-underscore names a class sets at class level or reaches through `self`: in a
    subclass of an aiohttp class, each is aiohttp's private member or may collide with one."""
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
    for stmt in cls.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_only_the_guard_module_touches_aiohttp_internals() -> None:
    """Outside `dataplane/aiohttp_private.py`, aiohttp is imported from its public modules only,
    and none of the private attributes the guard uses is reached for."""
    offenders = []
    swept = 0
    for package in ("shared", "controlplane", "dataplane"):
        for path in sorted((REPO / package).rglob("*.py")):
            if path == GUARD:
                continue
            swept += 1
            where = path.relative_to(REPO).as_posix()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    offenders += [
                        f"{where}:{node.lineno} import {a.name}"
                        for a in node.names
                        if a.name.split(".")[0] == "aiohttp" and a.name not in PUBLIC_MODULES
                    ]
                elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "aiohttp":
                    if node.module not in PUBLIC_MODULES or any(a.name.startswith("_") for a in node.names):
                        offenders.append(f"{where}:{node.lineno} from {node.module} import ...")
                elif isinstance(node, ast.ClassDef) and any(_from_aiohttp(base) for base in node.bases):
                    offenders += [f"{where}:{node.lineno} {node.name}.{name}" for name in _private_members(node)]
    assert swept > 100
    assert not offenders, f"aiohttp internals outside dataplane/aiohttp_private.py: {offenders}"
