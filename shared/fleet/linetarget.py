"""`LineTarget`: where and how a dedicated Redis connection of the data plane connects
(`ScriptLine`, the batching line), read from the pooled redis-py client's settings so both
connect alike; `pack` writes a command (RESP2); `establish` opens the socket (and TLS) within the connect bound."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from typing import Any

import msgspec

from shared.fleet import resp


def pack(args: Sequence[str | bytes | int]) -> bytes:
    """One command as a RESP2 array of bulk strings (`resp.pack`'s: a reserve's script 10–15 →
    7–9 µs here, on the ceilinged request's path before its write; issue 27 §4)."""
    return resp.pack((args,))


class LineTarget(msgspec.Struct, frozen=True):
    """Where and how to connect: the settings of the pooled client's connections."""

    host: str = ""
    port: int = 6379
    path: str = ""  # a Unix socket (then no host)
    tls: bool = False
    ca_certs: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    username: str | None = None
    password: str | None = None  # never logged (registered with the redactor by `connect`)
    db: int = 0
    timeout_s: float = 1.0
    connect_timeout_s: float = 0.5

    @classmethod
    def of(cls, kind: str, kwargs: dict[str, Any]) -> LineTarget:
        """From a redis-py pool's `connection_class.__name__` and `connection_kwargs`."""
        if kind not in ("Connection", "SSLConnection", "UnixDomainSocketConnection"):
            raise ValueError(f"no script line over a {kind}")
        return cls(
            host=kwargs.get("host") or "",
            port=int(kwargs.get("port") or 6379),
            path=kwargs.get("path") or "",
            tls=kind == "SSLConnection",
            ca_certs=kwargs.get("ssl_ca_certs"),
            certfile=kwargs.get("ssl_certfile"),
            keyfile=kwargs.get("ssl_keyfile"),
            username=kwargs.get("username"),
            password=kwargs.get("password"),
            db=int(kwargs.get("db") or 0),
            timeout_s=float(kwargs.get("socket_timeout") or 1.0),
            connect_timeout_s=float(kwargs.get("socket_connect_timeout") or 0.5),
        )

    def handshake(self) -> list[bytes]:
        """The commands a fresh connection sends before any script."""
        out = []
        if self.password is not None:
            out.append(pack(["AUTH", *([self.username] if self.username else []), self.password]))
        if self.db:
            out.append(pack(["SELECT", self.db]))
        return out

    def ssl_context(self) -> ssl.SSLContext | None:
        """redis-py's defaults for `rediss://`: the certificate and the host name verified."""
        if not self.tls:
            return None
        context = ssl.create_default_context(cafile=self.ca_certs)
        if self.certfile:
            context.load_cert_chain(self.certfile, self.keyfile)
        return context


async def establish(target: LineTarget, protocol: asyncio.Protocol) -> None:
    """Open the socket (and TLS) to `target` for `protocol` within `connect_timeout_s`."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(target.connect_timeout_s):
        if target.path:
            await loop.create_unix_connection(lambda: protocol, target.path)
        else:
            context = target.ssl_context()
            await loop.create_connection(
                lambda: protocol,
                target.host,
                target.port,
                ssl=context,
                server_hostname=target.host if context else None,
            )
