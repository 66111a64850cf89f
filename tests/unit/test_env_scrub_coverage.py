"""Every GATEWAY_* variable the code consumes is removed by `scrub_spawn_env` (SPEC §13).

The names are not listed by hand (a hand list drifts, seed 000 D2): they are read from the
source with `ast` — the settings module's `KNOWN` set (built as `PREFIX + n` over a split
string), every `_Reader` method call's literal name (`r.text("STATE_DIR", ...)` reads
`PREFIX + "STATE_DIR"`), every `PREFIX + "LITERAL"`, the legacy accounts' `credential_env`
names in the registry, and any `"GATEWAY_..."` literal in the daemons' packages. A non-vacuity
floor keeps an extractor that silently finds nothing from passing forever.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.envscrub import scrub_spawn_env

REPO = Path(__file__).resolve().parents[2]
SETTINGS = REPO / "shared" / "settings.py"
REGISTRY = REPO / "controlplane" / "registry.py"
NAME_RE = re.compile(r"^GATEWAY_[A-Z0-9_]+$")
MIN_NAMES = 25


def _prefix(tree: ast.Module) -> tuple[str, str]:
    """(variable name, value) of the module-level `PREFIX = "GATEWAY_"`-style constant."""
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)
            and node.value.value == "GATEWAY_"
        ):
            return node.targets[0].id, node.value.value
    raise AssertionError("settings.py no longer defines its GATEWAY_ prefix constant")


def _is_prefix_plus(node: ast.AST, prefix_var: str) -> ast.expr | None:
    if (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Add)
        and isinstance(node.left, ast.Name)
        and node.left.id == prefix_var
    ):
        return node.right
    return None


def _reader_methods(tree: ast.Module) -> set[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "_Reader":
            return {f.name for f in node.body if isinstance(f, ast.FunctionDef) and not f.name.startswith("_")}
    raise AssertionError("settings.py no longer has its _Reader class")


def settings_sources() -> dict[str, set[str]]:
    """The names settings.py consumes, by how the source spells them."""
    tree = ast.parse(SETTINGS.read_text())
    prefix_var, prefix = _prefix(tree)
    methods = _reader_methods(tree)
    found: dict[str, set[str]] = {"prefix-plus-literal": set(), "known-set": set(), "reader-call": set()}
    for node in ast.walk(tree):
        right = _is_prefix_plus(node, prefix_var)
        if isinstance(right, ast.Constant) and isinstance(right.value, str):
            found["prefix-plus-literal"].add(prefix + right.value)
        if isinstance(node, ast.GeneratorExp | ast.ListComp | ast.SetComp) and _is_prefix_plus(node.elt, prefix_var):
            for generator in node.generators:  # PREFIX + n for n in ("A B " "C").split()
                it = generator.iter
                if (
                    isinstance(it, ast.Call)
                    and isinstance(it.func, ast.Attribute)
                    and it.func.attr == "split"
                    and isinstance(it.func.value, ast.Constant)
                    and isinstance(it.func.value.value, str)
                ):
                    found["known-set"].update(prefix + part for part in it.func.value.value.split())
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in methods
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found["reader-call"].add(prefix + node.args[0].value)  # r.text("NAME") reads PREFIX + "NAME"
    return found


def settings_names() -> set[str]:
    return set().union(*settings_sources().values())


def registry_credential_names() -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(REGISTRY.read_text())):
        if isinstance(node, ast.keyword) and node.arg == "credential_env" and isinstance(node.value, ast.Constant):
            names.add(node.value.value)
    return names


def literal_names() -> set[str]:
    names = set()
    for package in ("shared", "controlplane", "dataplane"):
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME_RE.match(node.value):
                    names.add(node.value)
    return names


def test_extractors_are_not_vacuous() -> None:
    sources = settings_sources()
    assert len(sources["known-set"]) >= MIN_NAMES, sources
    assert len(sources["reader-call"]) >= MIN_NAMES - 5, sources  # every setting is read by a _Reader call
    found = settings_names()
    assert len(found) >= MIN_NAMES, sorted(found)
    assert {
        "GATEWAY_CONTROL_TOKEN",
        "GATEWAY_MINT_TOKEN",
        "GATEWAY_READ_TOKEN",
        "GATEWAY_STATE_DIR",
        "GATEWAY_ANTHROPIC_API_KEY",
        "GATEWAY_OPENAI_API_KEY",
        "GATEWAY_ZAI_API_KEY",
    } <= found
    # fleet mode's URL may carry the Redis password: it must be found (and so scrubbed) too
    assert {"GATEWAY_FLEET_REDIS_URL", "GATEWAY_FLEET_ID", "GATEWAY_HOST_ID", "GATEWAY_FLEET_HOST_TTL_SECONDS"} <= found
    assert registry_credential_names() == {"GATEWAY_ANTHROPIC_API_KEY", "GATEWAY_ZAI_API_KEY", "GATEWAY_OPENAI_API_KEY"}
    assert all(NAME_RE.match(n) for n in found), sorted(n for n in found if not NAME_RE.match(n))


def test_no_consumed_gateway_variable_survives_the_scrub() -> None:
    names = settings_names() | registry_credential_names() | literal_names()
    env = {name: "value-" + name for name in names}
    env.update({"PATH": "/usr/bin", "HOME": "/home/w", "ANTHROPIC_BASE_URL": "http://gw"})
    scrubbed = scrub_spawn_env(env)
    survivors = sorted(set(scrubbed) & names)
    assert survivors == [], f"scrub_spawn_env lets these through: {survivors}"
    assert scrubbed == {"PATH": "/usr/bin", "HOME": "/home/w", "ANTHROPIC_BASE_URL": "http://gw"}


@settings(max_examples=200, deadline=None)
@given(st.from_regex(r"\AGATEWAY_[A-Z0-9_]{1,40}\Z"))
def test_any_declared_credential_name_is_scrubbed(name: str) -> None:
    """A declared account's `credential_env` is operator-chosen: the whole namespace must go."""
    assert scrub_spawn_env({name: "secret", "PATH": "/bin"}) == {"PATH": "/bin"}
