"""Answering one request on a connection (`protocol.Connection`): the handler's response
written (a `Response` whole, in one write), then whether the connection can carry the next
request: the body the handler did not read is discarded first, within `Limits.lingering_s` and
`lingering_bytes` (a body declared larger closes the connection at once). And the answer to
bytes the server refused (the app's `refusal_answer`, on an HTTP/1.0 status line).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.http1.errors import Refusal, Refused
from shared.http1.headers import Headers
from shared.http1.request import Body, Request
from shared.http1.response import Response, StreamResponse

if TYPE_CHECKING:
    from shared.http1.host import Conn


def is_websocket(request: Request) -> bool:
    """A WebSocket handshake: what `Server.hand_off` takes."""
    return (request.headers.get("Upgrade") or "").lower() == "websocket"


async def answer_one(conn: Conn, request: Request) -> bool:
    """Answer `request`; True when the connection goes on to the next one."""
    server, limits = conn.server, conn.limits
    response, refused = await conn.app.handle(request)
    if refused is not None:
        server.refused[refused] += 1
    if request.started and not response.prepared:  # a stream failed midway: cut, not re-answered
        return False
    try:
        if not (response.prepared and response.ended):  # (else `_send` has nothing to do)
            await _send(response, request)
    except ConnectionResetError:
        return False
    keep = request.keep_alive and response.keep_alive and not conn.reading_stopped and not server.closing
    body = request.body
    if body.complete:
        return keep
    if body.failed is not None or refused is Refused.BODY_TIMEOUT:
        return False
    if body.expects_continue:  # a 100 never sent: no body is coming
        return False
    if body.declared is not None and body.declared > limits.lingering_bytes:
        return False  # more than would ever be discarded: closed now, not after reading some
    return await body.discard(limits.lingering_s, limits.lingering_bytes) and keep


async def answer_refusal(conn: Conn, refusal: Refusal) -> None:
    """The app's answer to what the server refused (none: the close says it all)."""
    answer = conn.app.refusal_answer(refusal)
    if answer is None:
        return
    request = Request(
        method="GET",
        version=(1, 0),
        target=b"/",
        headers=Headers([]),
        body=Body(conn, declared=0, expects_continue=False, limit_s=0, buffer_bytes=0),
        keep_alive=False,
        conn=conn,
        app=conn.app,
        max_body=0,
    )
    try:
        await _send(answer, request)
    except ConnectionResetError:
        pass


async def _send(response: StreamResponse, request: Request) -> None:
    if isinstance(response, Response) and not response.prepared:
        await response.send(request)
    else:  # (a stream the handler ended already costs no coroutine here: issue 27)
        if not response.prepared:
            await response.prepare(request)
        if not response.ended:
            await response.write_eof()
