"""In-process servers of `shared.http1` on 127.0.0.1 and a raw-bytes client for them.

`serve(app)` starts a `Server` on an ephemeral port; `AppClient` is the small part of
aiohttp's test client the control tests use (`get`/`post`/`put`/`request` on a path, each
returning aiohttp's client response), over a real socket. `Answer` reads one HTTP/1.x response
off a stream as bytes, framing included, so a test can assert what is on the wire.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from shared.http1.app import Application
from shared.http1.limits import DEFAULT_LIMITS, Limits
from shared.http1.server import Server


async def serve(app: Application, limits: Limits = DEFAULT_LIMITS) -> Server:
    server = Server(app, limits)
    await server.start("127.0.0.1", 0)
    return server


def url_of(server: Server, path: str) -> str:
    return f"http://127.0.0.1:{server.port}{path}"


class AppClient:
    """aiohttp's `TestClient` surface over a `shared.http1` server."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.session = aiohttp.ClientSession()

    def make_url(self, path: str) -> str:
        return url_of(self.server, path)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.session.request(method, self.make_url(path), **kwargs)

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> Any:
        return self.request("POST", path, **kwargs)

    def put(self, path: str, **kwargs: Any) -> Any:
        return self.request("PUT", path, **kwargs)

    def patch(self, path: str, **kwargs: Any) -> Any:
        return self.request("PATCH", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> Any:
        return self.request("DELETE", path, **kwargs)

    async def close(self) -> None:
        await self.session.close()
        await self.server.close()


class Answer:
    """One response as received: status line, headers (lower-cased names), the body (chunked
    framing decoded), and `raw`, the bytes as they came (framing kept)."""

    def __init__(self, status_line: str, headers: dict[str, str], body: bytes, raw: bytes) -> None:
        self.status_line, self.headers, self.body, self.raw = status_line, headers, body, raw
        self.status = int(status_line.split(" ")[1])

    @classmethod
    async def read(cls, reader: asyncio.StreamReader, head_only: bool = False, timeout_s: float = 5) -> Answer:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        body = b""
        if head_only:
            pass
        elif "content-length" in headers:
            body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), timeout_s)
        elif headers.get("transfer-encoding") == "chunked":
            framed = b""
            while True:
                line = await asyncio.wait_for(reader.readuntil(b"\r\n"), timeout_s)
                size = int(line.strip(), 16)
                chunk = await asyncio.wait_for(reader.readexactly(size + 2), timeout_s)
                framed += line + chunk
                body += chunk[:-2]
                if size == 0:
                    break
            return cls(lines[0], headers, body, head + framed)
        else:
            body = await asyncio.wait_for(reader.read(), timeout_s)
        return cls(lines[0], headers, body, head + body)


async def exchange(port: int, raw: bytes, *, head_only: bool = False) -> Answer:
    """Send `raw` on a fresh connection; the first response back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        return await Answer.read(reader, head_only=head_only)
    finally:
        writer.close()


async def closed_by_peer(reader: asyncio.StreamReader, timeout_s: float = 5) -> bool:
    """True when the server closed the connection (EOF or reset) within `timeout_s`."""
    try:
        rest = await asyncio.wait_for(reader.read(65536), timeout_s)
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return rest == b""
