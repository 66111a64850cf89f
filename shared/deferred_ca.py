"""aiohttp imported with its own TLS contexts reading the system CA bundle at their first handshake.

`import aiohttp` builds two client `ssl.SSLContext`s at module level (`aiohttp.connector`: one
verified, one not), and each reads and parses the system CA bundle: with OpenSSL 3 that is
~0.8 MiB and 40-150 ms of CPU a read, so ~2 MiB of RSS and about a third of `import aiohttp.web`
in the data plane, before anything is served (issue 27). The data plane's upstream client and
its aiohttp sessions use the data plane's own verified context
(`dataplane.upstream_client.UPSTREAM_TLS`: built by `create_default_context` here, its bundle
read on a thread once the data plane listens, `read_in_background`). Control imports no aiohttp
at all (`shared/http1/`).

Importing this module first (the data plane's main module does, before anything imports
aiohttp) imports aiohttp with `SSLContext.set_default_verify_paths` (what `load_default_certs`
calls on POSIX) deferred: a context built during that import reads the default paths at its
first `wrap_bio` or `wrap_socket` (where asyncio and uvloop start every TLS handshake), then
falls back to the class's own methods. The same certificates and the same verification, only
later, and only if the context is ever used. The stand-in is in place only while aiohttp is
imported (at start, on one thread). When aiohttp is already imported (a test process), nothing
changes. tests/unit/test_lazy_imports.py checks both halves: no CA read at a daemon's start, and a
verified handshake through aiohttp's default context afterwards.
"""

from __future__ import annotations

import ssl
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_READ_DEFAULT_PATHS = ssl.SSLContext.set_default_verify_paths
# The reader of each context whose CA paths are still to be read (contexts hash by identity).
_PENDING: dict[ssl.SSLContext, Callable[[], None]] = {}


def _at_first_handshake(context: ssl.SSLContext) -> None:
    """Stands in for `set_default_verify_paths`: `context` reads the default CA paths when it
    first wraps a connection, or when `read_default_paths` asks, whichever comes first."""
    lock = threading.Lock()

    def read_default_paths() -> None:
        with lock:
            if "wrap_bio" in vars(context):
                _READ_DEFAULT_PATHS(context)
                del context.wrap_bio, context.wrap_socket  # the class's own methods from now on
                _PENDING.pop(context, None)

    def wrap_bio(*args: Any, **kwargs: Any) -> ssl.SSLObject:
        read_default_paths()
        return context.wrap_bio(*args, **kwargs)

    def wrap_socket(*args: Any, **kwargs: Any) -> ssl.SSLSocket:
        read_default_paths()
        return context.wrap_socket(*args, **kwargs)

    context.wrap_bio = wrap_bio  # type: ignore[method-assign]
    context.wrap_socket = wrap_socket  # type: ignore[method-assign]
    _PENDING[context] = read_default_paths


def read_default_paths(context: ssl.SSLContext) -> None:
    """Read a deferred context's CA paths now (a no-op once read, or for any other context).
    OpenSSL releases the GIL while it reads, so a thread can do this beside the event loop; a
    handshake meanwhile waits for the read to finish."""
    read = _PENDING.get(context)
    if read is not None:
        read()


def read_in_background(context: ssl.SSLContext) -> None:
    """`read_default_paths` on a thread of its own that ends with it. A failed read is left to
    the first handshake, which retries it and fails there with the reason.

    Not a daemon thread: the interpreter joins it before it finalizes. A daemon thread still in
    OpenSSL's read while the interpreter tore itself down crashed a data plane stopped right
    after its start (SIGSEGV in libcrypto or malloc: 3 of 8 quick stops exited -11)."""

    def read() -> None:
        try:
            read_default_paths(context)
        except (OSError, ssl.SSLError):
            pass

    threading.Thread(target=read, name="ca-read", daemon=False).start()


@contextmanager
def _reads_deferred() -> Iterator[None]:
    """Contexts built meanwhile read their default CA paths later (one thread: at start only)."""
    ssl.SSLContext.set_default_verify_paths = _at_first_handshake  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        ssl.SSLContext.set_default_verify_paths = _READ_DEFAULT_PATHS  # type: ignore[method-assign]


def create_default_context() -> ssl.SSLContext:
    """`ssl.create_default_context()`, its CA bundle read at its first handshake or when
    `read_default_paths` / `read_in_background` asks."""
    with _reads_deferred():
        return ssl.create_default_context()


def import_aiohttp() -> None:
    """Import aiohttp, its contexts' CA reads deferred (a no-op when it is already imported)."""
    if "aiohttp" in sys.modules:
        return
    with _reads_deferred():
        import aiohttp  # noqa: F401


import_aiohttp()
