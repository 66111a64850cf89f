"""One test's fleet in a real Redis: its own key namespace, an asyncio client and a blocking one.

Every test gets a fresh `fleet_id`, so tests share one session-wide `redis-server` without
seeing each other's keys (and the namespace is deleted afterwards). Tests that break the
server on purpose (SIGSTOP, FLUSHALL, a restart) start their own `RedisServer` instead.
"""

from __future__ import annotations

import itertools
import os
import secrets
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from shared.fleet.entries import FleetEntries
from shared.fleet.keys import FleetKeys
from shared.fleet.redis_client import connect, connect_sync
from shared.fleet.secret import FleetSecret, Keyring
from tests.support.redis_server import RedisServer

_ids = itertools.count()
SECRET_NAME = "fleet-secret"


def fleet_secret_file(directory: Path) -> Path:
    """The fleet secret every host of a test fleet shares (SPEC §19): 32 random bytes, mode 0600,
    created once in `directory` (kept when it exists: a restarted host reads the same secret)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / SECRET_NAME
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(secrets.token_bytes(32))
    return path


class Fleet:
    def __init__(self, server: RedisServer, *, timeout_s: float = 1.0, fleet_id: str | None = None) -> None:
        self.server = server
        self.keys = FleetKeys(fleet_id or f"t{os.getpid()}-{next(_ids)}")
        self.timeout_s = timeout_s
        self._client: Any = None
        # The fleet's secret (SPEC §19) and what its hosts MAC with (each test: its own secret)
        self.secret = FleetSecret(secrets.token_bytes(32))
        self.keyring = Keyring(self.secret, self.keys.fleet_id)
        self.entries = FleetEntries(self.keyring)
        self._sync: redis.Redis | None = None
        self._admin = redis.Redis(
            host="127.0.0.1", port=server.port, socket_timeout=5, socket_connect_timeout=2, retry=Retry(NoBackoff(), 0)
        )

    @property
    def client(self) -> Any:
        """The asyncio client the event-loop backends use (made on first use, in the test's loop)."""
        if self._client is None:
            self._client = connect(self.server.url, timeout_s=self.timeout_s)
        return self._client

    @property
    def sync(self) -> redis.Redis:
        """The blocking client the chains use (made on first use)."""
        if self._sync is None:
            self._sync = connect_sync(self.server.url, timeout_s=self.timeout_s)
        return self._sync

    def key_names(self) -> list[bytes]:
        """Every key of this fleet now, read with SCAN (an admin connection, not the client under test)."""
        return sorted(self._admin.scan_iter(match=self.keys.prefix + "*", count=1000))

    def admin(self) -> Any:
        """A plain client for a test's own looks and pokes (TTLs, DUMP, FLUSHALL)."""
        return self._admin

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        self.close_sync()

    def close_sync(self) -> None:
        """Close a fleet whose asyncio client was never used (the chain tests run in threads)."""
        assert self._client is None, "an asyncio client is closed by `await close()`"
        try:
            for name in self.key_names():
                self._admin.delete(name)
        except redis.RedisError:
            pass  # a test that stopped its server has nothing left to clean
        if self._sync is not None:
            self._sync.close()
        self._admin.close()


def forge_chain_record(admin: redis.Redis, keys: FleetKeys, name: str, edit: Any) -> dict[str, Any]:
    """What a Redis writer without the fleet secret can do to a chain (SPEC §19): take its last
    record, `edit(fields)` it, append it with a correct `seq`, `prev_hash` and `hash` (no valid
    `mac`), and move the anchor and the revision counter to match. Answers the forged record."""
    import json

    from shared.chain import encode_anchor, encode_record, seal

    data = admin.get(keys.chain(name, "records")) or b""
    lines = data.splitlines()
    last = json.loads(lines[-1]) if lines else {}
    fields = {k: v for k, v in last.items() if k not in ("seq", "prev_hash", "hash", "mac")}
    record = seal(edit(fields), len(lines) + 1, last.get("hash", "0" * 64))
    admin.append(keys.chain(name, "records"), encode_record(record))
    admin.set(keys.chain(name, "anchor"), encode_anchor(len(lines) + 1, record["hash"]))
    admin.incr(keys.chain(name, "rev"))
    return record
