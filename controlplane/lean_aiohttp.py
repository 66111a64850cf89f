"""aiohttp's server half, imported without its client half until something asks for the client.

Control serves HTTP through `aiohttp.web` and never makes a request through aiohttp. But
`import aiohttp.web` runs `aiohttp/__init__.py` first, and that imports the whole client:
`aiohttp.client`, the connector (and its two TLS contexts), the cookie jar, form data, the
tracing module (~20 dataclasses built at import), aiohappyeyeballs and pickle: ~2 MiB of idle
RSS and about a fifth of `import aiohttp.web`'s CPU, on control's path to ready (issue 27).

`import_server_half()`, run when control's main module imports this module (before anything
imports aiohttp), puts
the package `aiohttp` in `sys.modules` without running its `__init__`: the package's
submodules (`aiohttp.web`, `aiohttp.abc`, ...) import as they always do, each importing what it
needs, and `__version__` (which `aiohttp.http` reads for the `Server` header) is read from the
package's source. The first attribute of the package that only `__init__` defines
(`aiohttp.ClientSession`, `aiohttp.__all__`, ...) runs `__init__` then, into the same module
object, with aiohttp's CA reads deferred as `shared.deferred_ca` does: nothing that asks for the
client is refused, it only waits for the first ask. Only public import machinery is used
(`importlib.util`, PEP 562's module `__getattr__`); when aiohttp is already imported, or its
version cannot be read, aiohttp is imported whole as before.
tests/unit/test_lazy_imports.py checks a serving control holds no client module, that the
package completes on first use, and the version read.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

_VERSION = re.compile(r'^__version__ = "([^"]+)"$', re.MULTILINE)


def import_server_half() -> None:
    """Install the package `aiohttp`, its `__init__` run at the first use of what it defines."""
    if "aiohttp" in sys.modules:
        return
    spec = importlib.util.find_spec("aiohttp")
    version = None if spec is None or spec.origin is None else package_version(Path(spec.origin))
    if spec is None or spec.loader is None or not spec.submodule_search_locations or version is None:
        _import_whole()
        return
    package = importlib.util.module_from_spec(spec)
    package.__version__ = version  # type: ignore[attr-defined]
    package.__getattr__ = _completer(package, spec)  # type: ignore[method-assign]
    sys.modules["aiohttp"] = package


def package_version(init_file: Path) -> str | None:
    """`__version__` as aiohttp's `__init__.py` assigns it (its first statement), or None."""
    try:
        found = _VERSION.search(init_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None
    return None if found is None else found.group(1)


def _completer(package: ModuleType, spec: importlib.machinery.ModuleSpec) -> Callable[[str], object]:
    """The package's `__getattr__` until its `__init__` has run: a submodule's name is left to
    the import system (`from aiohttp import web` asks the package for `web` first); any other
    name runs `__init__`, once, and is then looked up as usual."""
    lock = threading.Lock()
    path = list(spec.submodule_search_locations or ())

    def __getattr__(name: str) -> object:
        if importlib.machinery.PathFinder.find_spec(f"aiohttp.{name}", path) is not None:
            raise AttributeError(f"module 'aiohttp' has no attribute {name!r} (a submodule, not yet imported)")
        with lock:
            if vars(package).get("__getattr__") is __getattr__:
                _complete(package, spec, __getattr__)
        return getattr(package, name)

    return __getattr__


def _complete(package: ModuleType, spec: importlib.machinery.ModuleSpec, completer: Callable[[str], object]) -> None:
    """Run aiohttp's `__init__` into `package`, its CA reads deferred (`shared.deferred_ca`)."""
    from shared.deferred_ca import reads_deferred  # aiohttp is in sys.modules: imports nothing

    assert spec.loader is not None
    del package.__getattr__  # `__init__`'s own `from . import ...` must not come back here
    try:
        with reads_deferred():
            spec.loader.exec_module(package)
    except BaseException:
        package.__getattr__ = completer  # type: ignore[method-assign]
        raise


def _import_whole() -> None:
    import shared.deferred_ca  # noqa: F401  aiohttp, its CA reads deferred


import_server_half()
