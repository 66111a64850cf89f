"""`shared.http1`'s connections over real sockets: keep-alive, pipelining in order, HEAD,
`Expect: 100-continue` only once a handler reads, HTTP/1.0, the idle deadline, many
connections at once, a reader that stops reading (the handler waits; memory does not grow),
and a graceful shutdown."""

from __future__ import annotations

import asyncio
from typing import Any

from shared.http1.limits import Limits
from tests.support.http1 import Answer, closed_by_peer, exchange
from tests.support.http1_app import GATE, LIFECYCLE, READS, WRITTEN, build, get, post
from tests.support.waits import until


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def test_keep_alive_carries_several_requests_on_one_connection(app_server: Any) -> None:
    server = await app_server(build())
    reader, writer = await connect(server.port)
    for n in range(3):
        writer.write(get(f"/hello?n={n}"))
        answer = await Answer.read(reader)
        assert answer.status == 200 and answer.body == b'{"hello":"%d"}' % n
    assert len(server.connections) == 1
    writer.write(get("/hello", "Connection: close\r\n"))
    assert (await Answer.read(reader)).status == 200 and await closed_by_peer(reader)
    writer.close()


async def test_pipelined_requests_are_answered_in_order(app_server: Any) -> None:
    app = build()
    server = await app_server(app)
    reader, writer = await connect(server.port)
    writer.write(get("/gate") + post("/echo", b"second") + get("/hello?n=3") + get("/nope"))
    await until(lambda: app[READS] == [] and server.connections, 5, "the requests to arrive")
    app[GATE].set()  # the first answer is held until now; the others queue behind it
    answers = [await Answer.read(reader) for _ in range(4)]
    assert [a.body for a in answers] == [b"gate", b"second", b'{"hello":"3"}', b"404: Not Found"]
    writer.close()


async def test_head_answers_the_get_routes_head_without_a_body(app_server: Any) -> None:
    server = await app_server(build())
    reader, writer = await connect(server.port)
    writer.write(b"HEAD /hello?n=1 HTTP/1.1\r\nHost: t\r\n\r\n" + get("/hello?n=2"))
    head = await Answer.read(reader, head_only=True)
    assert head.status == 200 and head.headers["content-length"] == "13"
    following = await Answer.read(reader)  # no body bytes came between the two answers
    assert following.status_line == "HTTP/1.1 200 OK" and following.body == b'{"hello":"2"}'
    writer.write(b"HEAD /stream HTTP/1.1\r\nHost: t\r\n\r\n" + get("/hello?n=3"))
    assert (await Answer.read(reader, head_only=True)).headers["transfer-encoding"] == "chunked"
    assert (await Answer.read(reader)).body == b'{"hello":"3"}'
    writer.write(b"POST /hello HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
    not_allowed = await Answer.read(reader)
    assert not_allowed.status == 405 and not_allowed.headers["allow"] == "GET,HEAD"
    writer.close()


async def test_100_continue_is_sent_only_when_the_handler_reads(app_server: Any) -> None:
    app = build()
    server = await app_server(app)
    expect = b"POST /private/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n"
    reader, writer = await connect(server.port)
    writer.write(expect + b"\r\n")  # no token: refused before any body is asked for
    refused = await Answer.read(reader)
    assert refused.status == 401 and b"100 Continue" not in refused.raw and await closed_by_peer(reader)
    writer.close()
    reader, writer = await connect(server.port)
    writer.write(expect + b"Authorization: Bearer ok\r\n\r\n")
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"body")
    answer = await Answer.read(reader)
    assert answer.status == 200 and answer.body == b"body" and app[READS] == [4]
    writer.close()


async def test_an_unread_body_is_discarded_and_the_connection_reused(app_server: Any) -> None:
    server = await app_server(build())
    reader, writer = await connect(server.port)
    writer.write(post("/hello", b"x" * 5000) + get("/hello?n=2"))  # 405: its body never read
    assert (await Answer.read(reader)).status == 405
    assert (await Answer.read(reader)).body == b'{"hello":"2"}'
    writer.close()


async def test_http_1_0_is_answered_in_1_0_and_closed_unless_kept_alive(app_server: Any) -> None:
    server = await app_server(build())
    reader, writer = await connect(server.port)
    writer.write(get("/hello?n=1", version="1.0"))
    answer = await Answer.read(reader)
    assert answer.status_line == "HTTP/1.0 200 OK" and await closed_by_peer(reader)
    writer.close()
    reader, writer = await connect(server.port)
    writer.write(get("/hello", "Connection: keep-alive\r\n", version="1.0") + get("/stream?n=2&size=3", version="1.0"))
    assert (await Answer.read(reader)).headers["connection"] == "keep-alive"
    streamed = await Answer.read(reader)  # close-delimited: no chunked framing on 1.0
    assert "transfer-encoding" not in streamed.headers and streamed.body == b"xxxxxx"
    writer.close()


async def test_an_idle_connection_is_closed_after_the_keep_alive_deadline(app_server: Any) -> None:
    server = await app_server(build(), limits=Limits(keepalive_s=0.2))
    reader, writer = await connect(server.port)
    writer.write(get("/hello"))
    assert (await Answer.read(reader)).status == 200
    assert await closed_by_peer(reader, timeout_s=5)
    writer.close()


async def test_many_connections_at_once(app_server: Any) -> None:
    server = await app_server(build())

    async def one(n: int) -> bytes:
        return (await exchange(server.port, get(f"/hello?n={n}"))).body

    bodies = await asyncio.gather(*(one(n) for n in range(200)))
    assert bodies == [b'{"hello":"%d"}' % n for n in range(200)]
    await until(lambda: not server.connections, 5, "every connection closed")


async def test_a_reader_that_stops_reading_holds_its_handler_not_memory(app_server: Any) -> None:
    app = build()
    server = await app_server(app)
    reader, writer = await connect(server.port)
    sock = writer.get_extra_info("socket")
    writer.write(get("/stream?n=4000&size=65536"))  # 250 MiB if nothing waited
    await until(
        lambda: any(c._drain is not None and not c._drain.done() for c in server.connections), 10, "writes to wait"
    )
    held = sum(app[WRITTEN])
    assert held < 32 * 1024 * 1024, held  # the handler waits on the socket
    assert sock is not None
    total = 0
    while total < 4000 * 65536:
        chunk = await asyncio.wait_for(reader.read(1 << 20), 10)
        assert chunk
        total += len(chunk)
    writer.close()


async def test_shutdown_closes_idle_connections_and_lets_answers_finish(app_server: Any) -> None:
    app = build()
    server = await app_server(app)
    idle_reader, idle_writer = await connect(server.port)
    idle_writer.write(get("/hello"))
    assert (await Answer.read(idle_reader)).status == 200
    busy_reader, busy_writer = await connect(server.port)
    busy_writer.write(get("/gate"))  # held until on_shutdown sets the gate
    await until(lambda: any(c._task for c in server.connections), 5, "the held request to arrive")
    await server.close()
    assert await closed_by_peer(idle_reader)
    answer = await Answer.read(busy_reader)
    assert answer.body == b"gate" and await closed_by_peer(busy_reader)
    assert app[LIFECYCLE] == ["started", "shutdown", "cleaned"]
    idle_writer.close()
    busy_writer.close()


async def test_more_pipelined_requests_than_the_queue_holds_are_all_answered_in_order(app_server: Any) -> None:
    server = await app_server(build(), limits=Limits(max_pipelined=4))
    reader, writer = await connect(server.port)
    writer.write(b"".join(get(f"/hello?n={n}") for n in range(40)))  # one write: parsing pauses past 4
    bodies = [(await Answer.read(reader)).body for _ in range(40)]
    assert bodies == [b'{"hello":"%d"}' % n for n in range(40)]
    writer.close()


async def test_a_body_larger_than_the_read_ahead_buffer_arrives_whole(app_server: Any) -> None:
    app = build(max_size=4 * 1024 * 1024)
    server = await app_server(app, limits=Limits(body_buffer_bytes=16 * 1024))
    body = bytes(range(256)) * 8192  # 2 MiB: reading pauses and resumes as the handler reads
    answer = await exchange(server.port, post("/echo", body))
    assert answer.status == 200 and answer.body == body and app[READS] == [len(body)]


async def test_a_stream_that_fails_midway_is_cut_not_answered_twice(app_server: Any) -> None:
    server = await app_server(build())
    reader, writer = await connect(server.port)
    writer.write(get("/breaks"))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 200 OK")
    rest = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), 5):
            rest += chunk
    except ConnectionResetError:
        pass
    assert b"partial" in rest and b"HTTP/1.1 500" not in rest and not rest.endswith(b"0\r\n\r\n")
    writer.close()


async def test_a_peer_that_half_closes_after_its_requests_still_gets_its_answers(app_server: Any) -> None:
    server = await app_server(build())
    reader, writer = await connect(server.port)
    writer.write(get("/hello?n=1") + get("/hello?n=2"))
    writer.write_eof()
    assert [(await Answer.read(reader)).body for _ in range(2)] == [b'{"hello":"1"}', b'{"hello":"2"}']
    assert await closed_by_peer(reader)
    writer.close()


async def test_a_half_close_after_more_requests_than_the_queue_holds_answers_them_all(app_server: Any) -> None:
    server = await app_server(build(), limits=Limits(max_pipelined=2))
    reader, writer = await connect(server.port)
    writer.write(b"".join(get(f"/hello?n={n}") for n in range(10)))
    writer.write_eof()
    assert [(await Answer.read(reader)).body for _ in range(10)] == [b'{"hello":"%d"}' % n for n in range(10)]
    assert await closed_by_peer(reader)
    writer.close()
