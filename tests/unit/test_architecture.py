"""The rooms' boundaries, read from the source: who may import whom, and what a core may touch."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IO_MODULES = {
    "asyncio",
    "aiohttp",
    "filelock",
    "structlog",
    "os",
    "socket",
    "time",
    "secrets",
    "random",
    "subprocess",
    "shared.logging",
    "shared.clock",
}


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
            allowed = (
                top in ("shared", "__future__", "msgspec")
                or top in sys.stdlib_module_names
                or name == "controlplane.cli"
                or name.startswith("controlplane.cli.")
            )
            if not allowed:
                offenders.setdefault(path.name, []).append(name)
    assert offenders == {}, f"leaseholdctl must not import these: {offenders}"


# ---- the import graph: no cycles, function-level imports included --------------------------

PROJECT = ("shared", "controlplane", "dataplane")


def project_modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for top in PROJECT:
        for path in sorted((REPO / top).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module → the project modules it imports, from every import statement anywhere in it
    (a function-level import hides a cycle; it does not remove it)."""
    found = project_modules()

    def resolve(name: str) -> str | None:
        while name and name not in found:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in found}
    for module, path in found.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [base + "." + alias.name for alias in node.names] + [base]
            for target in targets:
                resolved = resolve(target)
                if (
                    resolved
                    and resolved != module
                    and not (path.name == "__init__.py" and resolved.startswith(module + "."))
                ):
                    graph[module].add(resolved)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            pushed = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    pushed = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if pushed:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_import_graph_has_no_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 60 and graph["controlplane.main"]  # the sweep is not vacuous
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_a_core_module_imports_only_core_and_shared() -> None:
    graph = import_graph()
    cores = [m for m in graph if m.startswith("controlplane.core.")]
    assert len(cores) >= 7
    offenders = {
        m: sorted(t for t in graph[m] if not (t.startswith("controlplane.core") or t.startswith("shared")))
        for m in cores
    }
    assert {m: t for m, t in offenders.items() if t} == {}


def test_every_app_key_is_declared_in_http_appkeys() -> None:
    """Handlers find their collaborators' keys in one module, so no handler imports another."""
    declared = {}
    for path in modules("controlplane"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "AppKey":
                declared.setdefault(path.relative_to(REPO).as_posix(), 0)
                declared[path.relative_to(REPO).as_posix()] += 1
    assert list(declared) == ["controlplane/http/appkeys.py"] and declared["controlplane/http/appkeys.py"] >= 10
