"""The rooms' boundaries, read from the source: who may import whom, and what a core may touch."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IO_MODULES = {"asyncio", "aiohttp", "filelock", "structlog", "os", "socket", "time", "secrets", "random",
              "subprocess", "shared.logging", "shared.clock"}


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def modules(package: str) -> list[Path]:
    found = sorted((REPO / package).rglob("*.py"))
    assert found, package
    return found


def test_dataplane_never_imports_controlplane() -> None:
    for path in modules("dataplane"):
        assert not any(n.split(".")[0] == "controlplane" for n in imports_of(path)), path


def test_controlplane_never_imports_dataplane() -> None:
    for path in modules("controlplane"):
        assert not any(n.split(".")[0] == "dataplane" for n in imports_of(path)), path


def test_shared_imports_neither_daemon() -> None:
    for path in modules("shared"):
        assert not any(n.split(".")[0] in ("dataplane", "controlplane") for n in imports_of(path)), path


def test_cores_do_no_io() -> None:
    cores = modules("controlplane/core")
    assert len(cores) >= 6
    for path in cores:
        bad = {n for n in imports_of(path) if n in IO_MODULES or n.split(".")[0] in IO_MODULES}
        assert not bad, f"{path.name} imports {bad}"


def test_cli_imports_only_shared_its_own_package_and_the_stdlib() -> None:
    """leaseholdctl is a client of the control HTTP API, not of the daemon's internals."""
    files = [REPO / "controlplane" / "ctl.py", *sorted((REPO / "controlplane" / "cli").glob("*.py"))]
    assert len(files) >= 9  # ctl.py + the package's modules: the sweep is not vacuous
    offenders = {}
    for path in files:
        for name in imports_of(path):
            top = name.split(".")[0]
            allowed = (top in ("shared", "__future__", "msgspec") or top in sys.stdlib_module_names
                       or name == "controlplane.cli" or name.startswith("controlplane.cli."))
            if not allowed:
                offenders.setdefault(path.name, []).append(name)
    assert offenders == {}, f"leaseholdctl must not import these: {offenders}"
