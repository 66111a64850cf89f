"""Every name ARCHITECTURE.md and docs/ put in backticks still exists: a file or module path, or
a symbol found in the source tree; ARCHITECTURE.md itself names no private symbol and stays on
one page (120 lines). A rename that forgets the map fails here, naming the stale name."""

from __future__ import annotations

import keyword
import re
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = (REPO / "ARCHITECTURE.md", REPO / "docs" / "codemap.md", REPO / "docs" / "internals.md")
SOURCE_DIRS = ("shared", "controlplane", "dataplane", "tests", "bench", "systemd")
SOURCE_SUFFIXES = {".py", ".js", ".html", ".css", ".toml", ".example", ".service", ".cfg"}
MAX_ARCHITECTURE_LINES = 120
# A backticked code name: identifiers joined by `.` or `/`, maybe a file suffix or a call's `()`.
FILE = re.compile(r"\.(py|md|toml|js|html|css|json|jsonl|gz|txt|cfg|bin|service|example|sh)$")
NAME = re.compile(r"^[A-Za-z_][\w]*(?:[./][A-Za-z_][\w-]*)*(?:\(\))?$")


def backticked(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # drawings, not names
    return re.findall(r"`([^`\n]+)`", text)


@cache
def files() -> tuple[str, ...]:
    found = [
        p.relative_to(REPO).as_posix()
        for p in REPO.rglob("*")
        if p.is_file() and ".venv" not in p.parts and ".git" not in p.parts
    ]
    return tuple(found)


@cache
def source(path: str) -> str:
    return (REPO / path).read_text(errors="replace")


@cache
def sources() -> tuple[str, ...]:
    return tuple(
        path
        for path in files()
        if path.split("/")[0] in SOURCE_DIRS
        and Path(path).suffix in SOURCE_SUFFIXES
        or path in ("Makefile", "setup.cfg", "pyproject.toml")
    )


@cache
def words() -> frozenset[str]:
    return frozenset(w for path in sources() for w in re.findall(r"[A-Za-z_][\w]*", source(path)))


def mentioned(text: str) -> bool:
    return any(text in source(path) for path in sources())


def module_file(parts: list[str]) -> str | None:
    """The file a path of module parts names (`core/mint`, `shared.wire`), matched by its end."""
    tail = "/".join(parts)
    for candidate in (tail + ".py", tail + "/__init__.py"):
        hits = [f for f in files() if f == candidate or f.endswith("/" + candidate)]
        if hits:
            return hits[0]
    return None


def exists(name: str) -> bool:
    name = name.removesuffix("()")
    if any(f == name or f.endswith("/" + name) or f == name.rstrip("/") for f in files()):
        return True  # a file: `stores/admin.py`, `data/prices.toml`
    if any(f.startswith(name.rstrip("/") + "/") or ("/" + name.rstrip("/") + "/") in "/" + f for f in files()):
        return True  # a directory: `wires/`, `core/`
    if FILE.search(name):  # a file that is not in the repo: one the
        return "/" not in name and mentioned(name)  # daemons write (`ledger.jsonl`), or none
    parts = re.split(r"[./]", name)
    for split in range(len(parts), 0, -1):  # the longest module prefix, then its symbols
        module = module_file(parts[:split])
        if module is not None:
            rest = parts[split:]
            return all(re.search(rf"\b{re.escape(p)}\b", source(module)) or p in words() for p in rest[-1:])
    return parts[-1] in words()


def names_in(path: Path) -> list[str]:
    return [n for n in backticked(path) if NAME.match(n) and not keyword.iskeyword(n)]


def test_every_backticked_name_exists() -> None:
    stale = {}
    for doc in DOCS:
        assert doc.exists(), doc
        gone = sorted({n for n in names_in(doc) if not exists(n)})
        if gone:
            stale[doc.relative_to(REPO).as_posix()] = gone
    assert not stale, f"names in the docs that no longer exist: {stale}"


def test_architecture_is_one_page_of_public_names() -> None:
    doc = REPO / "ARCHITECTURE.md"
    lines = len(doc.read_text().splitlines())
    assert lines <= MAX_ARCHITECTURE_LINES, f"ARCHITECTURE.md has {lines} lines; the long form goes to docs/"
    private = sorted({n for n in names_in(doc) if any(p.startswith("_") for p in re.split(r"[./]", n))})
    assert not private, f"ARCHITECTURE.md names private symbols (name their modules instead): {private}"
