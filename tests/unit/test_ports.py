"""Ports, not a hub: outside `controlplane/main.py` and `controlplane/wiring.py` (which wire) and `controlplane/service.py`
(the service itself), no module of the control daemon reaches through the `ControlService`.

Each part is handed the ports it uses (`controlplane/ports.py`): it never imports the service's
module, so it can only name a port's type, and mypy holds it to what that port declares; and it
never reaches `service.<x>`, `<x>.service` or `app[SERVICE]`, read from the source (docstrings
and strings are not code). Issue 26 began with 63 of them (this detector, at 4ff7ef7); 0 now.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WIRING = {"controlplane/main.py", "controlplane/wiring.py", "controlplane/service.py"}
SERVICE_MODULE = "controlplane.service"


def reaches(source: str) -> list[str]:
    """Each place `source` reaches through the service: `service.x`, `x.service`, `x[SERVICE]`,
    or an import of the service's module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "service":
                found.append(f"{node.lineno}: service.{node.attr}")
            elif node.attr == "service":
                found.append(f"{node.lineno}: .service")
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Name) and node.slice.id == "SERVICE":
            found.append(f"{node.lineno}: [SERVICE]")
        elif isinstance(node, ast.Name) and node.id == "ControlService":
            found.append(f"{node.lineno}: ControlService")
        elif isinstance(node, ast.ImportFrom) and node.module == SERVICE_MODULE:
            found.append(f"{node.lineno}: from {SERVICE_MODULE} import")
        elif isinstance(node, ast.Import) and any(a.name == SERVICE_MODULE for a in node.names):
            found.append(f"{node.lineno}: import {SERVICE_MODULE}")
    return found


@pytest.mark.parametrize(
    ("source", "count"),
    [
        ("service.keys.all()", 1),
        ("self.service.routes", 1),
        ("request.app[SERVICE].link.connected", 1),
        ("from controlplane.service import ControlService", 1),
        ("import controlplane.service", 1),
        ("def f(s: ControlService) -> None: ...", 1),
        ("x = self.service.keys.count_by_account()", 1),
        ("service.link.connected and service.ledger.ok", 2),
        ("self.keys.all(); self.seam.end_keys([], reason)", 0),
        ('attrs["service.name"] = name', 0),
        ('"""reaches `service.row_sinks` in prose"""', 0),
        ("service_name = config.service_name", 0),
    ],
)
def test_the_detector(source: str, count: int) -> None:
    assert len(reaches(source)) == count, reaches(source)


def test_no_module_outside_the_wiring_reaches_through_the_service() -> None:
    swept = 0
    found = {}
    for path in sorted((REPO / "controlplane").rglob("*.py")):
        name = path.relative_to(REPO).as_posix()
        if name in WIRING:
            continue
        swept += 1
        hits = reaches(path.read_text())
        if hits:
            found[name] = hits
    assert swept >= 100  # every module of the daemon, not a corner of it
    assert found == {}, f"reaching through the service instead of a port (controlplane/ports.py): {found}"


def test_the_wiring_still_reaches_it() -> None:
    """The sweep's exemption is not hiding everything: `wire` is where the service is built."""
    assert reaches((REPO / "controlplane" / "wiring.py").read_text())
