"""The HTTP errors a handler raises (rendered as aiohttp renders them: `text/plain`,
`"{status}: {reason}"` unless a text is given) and the server's refusal reasons.

A `Refused` reason is counted (`Server.refused`) each time the server answers or drops a
connection for what the peer sent or failed to send; the loop that read it goes on.
"""

from __future__ import annotations

from enum import StrEnum

from shared.http1.headers import reason_of


class Refused(StrEnum):
    BAD_REQUEST = "bad-request"  # the parser refused the bytes (llhttp's strict mode)
    LINE_TOO_LONG = "line-too-long"
    FIELD_TOO_LONG = "field-too-long"
    TOO_MANY_HEADERS = "too-many-headers"
    HEAD_TOO_LARGE = "head-too-large"
    HEAD_TIMEOUT = "head-timeout"
    BODY_TIMEOUT = "body-timeout"
    BODY_TOO_LARGE = "body-too-large"
    HANDLER_FAILED = "handler-failed"  # a handler raised: 500, the connection closed
    CONNECTION_LIMIT = "connection-limit"  # over `Limits.max_connections`: answered, closed unread


class HTTPException(Exception):
    """Raised by a handler (or a body read) to answer `status` with a plain-text body."""

    status = 500

    def __init__(self, *, text: str | None = None, headers: dict[str, str] | None = None) -> None:
        self.text = text if text is not None else f"{self.status}: {reason_of(self.status)}"
        self.headers = {"Content-Type": "text/plain; charset=utf-8", **(headers or {})}
        super().__init__(self.text)


class HTTPBadRequest(HTTPException):
    status = 400


class HTTPNotFound(HTTPException):
    status = 404


class HTTPMethodNotAllowed(HTTPException):
    status = 405

    def __init__(self, method: str, allowed: set[str]) -> None:
        super().__init__(headers={"Allow": ",".join(sorted(allowed))})
        self.method = method


class HTTPRequestTimeout(HTTPException):
    status = 408


class HTTPRequestEntityTooLarge(HTTPException):
    status = 413

    def __init__(self, max_size: int) -> None:
        super().__init__(text=f"Maximum request body size {max_size} exceeded.")


class BodyIncomplete(ConnectionResetError):
    """The peer closed, or its bytes broke the framing, before the body was whole."""


class Refusal(Exception):
    """What the connection answers instead of a request, then closes (aiohttp's shape: an
    HTTP/1.0 status line, a plain-text reason)."""

    def __init__(self, reason: Refused, text: str, status: int = 400) -> None:
        super().__init__(text)
        self.reason, self.text, self.status = reason, text, status


def parser_reason(exc: Exception) -> str:
    """llhttp's reason for a refusal, as a sentence (never the request's bytes)."""
    text = str(exc) or type(exc).__name__
    return text if text.endswith(".") else text + "."
