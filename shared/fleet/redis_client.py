"""The one way Leasehold talks to Redis: clients with bounded waits, failures as `StateUnavailable`.

Rule: no call waits on Redis longer than its bound, and no Redis failure escapes as anything but
`StateUnavailable` (a timeout, a refused connection, an error reply, a full pool alike). A
caller holds (503 `fleet-state-unavailable`) rather than guessing. A timeout's outcome is
unknown (the command may have run); every write here is idempotent or a compare-and-set, so
the retry a held caller makes is safe.

Bounds: `timeout_s` for a reply (a paused server is noticed within it), `connect_timeout_s`
to open a connection; one retry on a broken connection only (a pooled connection that died
with a restarted server is replaced at once, while a timeout is never retried: that would
double the bound). The pool is bounded too: a caller waits at most `timeout_s` for one of
`max_connections`.

The URL may carry a password: it is registered with the log redactor here, and only
`describe(url)` (scheme, host, port, database) is ever logged.
"""

from __future__ import annotations

import asyncio
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio as aredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry as SyncRetry

from shared.capacity import StateUnavailable
from shared.logging import register_secret

SCHEMES = ("redis", "rediss", "unix")
TIMEOUT_S = 1.0  # longest wait for one reply (a paused server is noticed within it)
CONNECT_TIMEOUT_S = 0.5  # longest wait to open one connection (loopback or LAN)
# Concurrent commands of one process; more wait (at most TIMEOUT_S) for a free connection.
MAX_CONNECTIONS = 64

_FAILURES = (redis.RedisError, OSError, TimeoutError)


class StateLost(StateUnavailable):
    """Redis answered, but it no longer holds the fleet state this process registered into
    (a restart without persistence, a failover that dropped writes): hold, re-claim the host
    id and re-register this host's holders before admitting new ones (SPEC §16)."""


def connect(
    url: str,
    *,
    timeout_s: float = TIMEOUT_S,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
) -> aredis.Redis:
    """An asyncio client for the event-loop backends (capacity, circuits, decisions, hosts)."""
    _register_password(url)
    pool = aredis.BlockingConnectionPool.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=connect_timeout_s,
        retry=AsyncRetry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
        max_connections=max_connections,
        timeout=timeout_s,
        health_check_interval=0,
    )
    return aredis.Redis(connection_pool=pool)


def connect_sync(
    url: str,
    *,
    timeout_s: float = TIMEOUT_S,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
) -> redis.Redis:
    """A blocking client, for the chains (`HashChain` calls its storage from worker threads)."""
    _register_password(url)
    pool = redis.BlockingConnectionPool.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=connect_timeout_s,
        retry=SyncRetry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
        max_connections=max_connections,
        timeout=timeout_s,
        health_check_interval=0,
    )
    return redis.Redis(connection_pool=pool)


def guard(what: str) -> Guard:
    """Turn any Redis failure inside the block (sync or `await`ed) into `StateUnavailable`.

    The message names the operation and the failure's class, never the reply text verbatim
    beyond its first line (it may quote a key, never a value: no value here is secret anyway).
    A class, not a generator context manager: it wraps every Redis call (issue 27 §4)."""
    return Guard(what)


class Guard:
    """`guard`'s block."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if exc is None or isinstance(exc, StateUnavailable) or not isinstance(exc, _FAILURES):
            return  # nothing swallowed: the block's own exception, if any, goes on
        if _cancelling():  # a cancelled call the client reported as a timeout: still a cancel
            raise asyncio.CancelledError() from exc
        raise unavailable(self.what, exc) from exc


def unavailable(what: str, exc: BaseException) -> BaseException:
    """What `guard` makes of `exc` (a Redis failure: `StateUnavailable` naming `what`; anything
    else as it is), for a caller answered without a block around it (`batching.soon`)."""
    if isinstance(exc, StateUnavailable) or not isinstance(exc, _FAILURES):
        return exc
    detail = str(exc).splitlines()[0][:200] if str(exc) else ""
    failure = StateUnavailable(f"{what}: {type(exc).__name__} {detail}".rstrip())
    failure.__cause__ = exc
    return failure


def raise_if_cancelled() -> None:
    """For a loop that lives as long as its task: redis-py can return a reply to a task whose
    cancellation is pending (the cancel is then consumed), so a loop asks before each turn."""
    if _cancelling():
        raise asyncio.CancelledError()


def _cancelling() -> bool:
    try:
        task = asyncio.current_task()
    except RuntimeError:  # a worker thread (the chains): no task to cancel
        return False
    return task is not None and task.cancelling() > 0


def describe(url: str) -> str:
    """The URL without its credentials, for a log line: `redis://host:port/db`."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    host = parts.hostname or ""
    shown = f"[{host}]" if ":" in host else host
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{shown}{port}{parts.path or ''}"


def _register_password(url: str) -> None:
    parts = urlsplit(url)
    if parts.password:
        register_secret(unquote(parts.password))
    for password in parse_qs(parts.query).get("password", []):
        register_secret(password)
