"""The names control's handler modules used from aiohttp's `web`, from this package: a handler
imports `from shared.http1 import web` and reads as it did."""

from shared.http1.app import Application, middleware
from shared.http1.errors import HTTPBadRequest, HTTPException, HTTPMethodNotAllowed, HTTPNotFound
from shared.http1.request import Request
from shared.http1.response import Response, StreamResponse
from shared.http1.server import Server
from shared.http1.sse import EventSourceResponse
from shared.http1.state import AppKey, RequestKey, State

__all__ = [
    "AppKey",
    "Application",
    "EventSourceResponse",
    "HTTPBadRequest",
    "HTTPException",
    "HTTPMethodNotAllowed",
    "HTTPNotFound",
    "Request",
    "RequestKey",
    "Response",
    "Server",
    "State",
    "StreamResponse",
    "middleware",
]
