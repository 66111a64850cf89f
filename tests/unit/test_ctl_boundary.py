"""leaseholdctl is a client of the control HTTP API: it imports `shared` and its own package only."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CLI_FILES = [REPO / "controlplane" / "ctl.py", *sorted((REPO / "controlplane" / "cli").glob("*.py"))]
THIRD_PARTY_ALLOWED = {"msgspec"}


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_cli_imports_only_shared_its_own_package_and_the_stdlib() -> None:
    assert len(CLI_FILES) >= 9  # ctl.py + the package's modules: the sweep is not vacuous
    offenders = {}
    for path in CLI_FILES:
        for name in imports_of(path):
            top = name.split(".")[0]
            allowed = (top == "shared" or name == "controlplane.cli" or name.startswith("controlplane.cli.")
                       or top in sys.stdlib_module_names or top in THIRD_PARTY_ALLOWED or top == "__future__")
            if not allowed:
                offenders.setdefault(path.name, []).append(name)
    assert offenders == {}, f"leaseholdctl must not import these: {offenders}"
