"""A reader process's work (`dataplane.readers`): what holds the GIL long on a large body.

The data plane's `bodies._readers` starts `serve_reader` in each reader process. A request's
kind says what to do with the body: `PEEK`, the strict read (`bodies.answer`); `ASK_USAGE`,
`usage_ask.with_usage` on a body with a `stream_options` member (its top-level scan is a
Python loop and a regular expression over every token before that member); `READ_MESSAGE`,
a client WebSocket message's strict read (`websocket.events.message_answer`, imported at its
first one).
"""

from __future__ import annotations

from dataplane.bodies import BodyPeek, answer
from dataplane.readers import serve
from dataplane.usage_ask import ASK_USAGE, with_usage

PEEK = 0
READ_MESSAGE = 2  # `websocket.events.READ_MESSAGE`
_HAS_OPTIONS = BodyPeek(None, True, False, True)


def _answer(kind: int, body: bytes) -> bytes:
    if kind == ASK_USAGE:
        asked = with_usage(body, _HAS_OPTIONS)
        return asked or b""  # a rewritten body is never empty
    if kind == READ_MESSAGE:
        from dataplane.websocket.events import message_answer

        return message_answer(body)
    return answer(body)


def serve_reader(fd: int) -> None:
    """A reader process's entry: requests answered until EOF."""
    serve(fd, _answer)
