"""The wire table's contract (issue 26): every wire in `dataplane/wires/table.WIRES` and
`shared/wires.FACTS` keeps it, and no module outside them branches on a wire.

The contract tests enumerate the table, so a new wire is held to them by being added to it. The
source scan reads every module of the three rooms: a comparison or `match` against a `Wire`
member or a wire's string, or any other mention of a `Wire` member (a dict keyed by them, a
return of one) is a wire branch, and lives only in `dataplane/wires/`, `shared/wires.py` and `shared/codes.py` (which
defines the members and maps bindings onto them).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from dataplane.bodies import strict_peek
from dataplane.ratelimits import rate_limits_of
from dataplane.wires.spec import WireSpec
from dataplane.wires.table import DEFAULT, NOT_PROXIED, WIRES, guess_wire
from shared.codes import AuthStyle, Wire
from shared.wire import RATE_LIMIT_KINDS
from shared.wires import DEFAULT_WIRE, FACTS

REPO = Path(__file__).resolve().parents[2]
ROOMS = ("dataplane", "controlplane", "shared")
ALLOWED = ("dataplane/wires/", "shared/wires.py", "shared/codes.py")
WIRE_STRINGS = frozenset(str(wire) for wire in Wire)
SPECS = list(WIRES.values())


# ---- no wire branch outside the table -------------------------------------------------------


def _is_member(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "Wire"
        and node.attr in Wire.__members__
    )


def _is_wire_value(node: ast.AST) -> bool:
    return _is_member(node) or (isinstance(node, ast.Constant) and node.value in WIRE_STRINGS)


def wire_branches(source: str) -> list[int]:
    """The lines of `source` that branch on a wire (see the module docstring)."""
    lines: list[int] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(map(_is_wire_value, [node.left, *node.comparators])):
            lines.append(node.lineno)
        elif isinstance(node, ast.match_case) and any(
            isinstance(sub, ast.MatchValue) and _is_wire_value(sub.value) for sub in ast.walk(node.pattern)
        ):
            lines.append(node.pattern.lineno)
        elif isinstance(node, ast.Dict) and any(k is not None and _is_member(k) for k in node.keys):
            lines.append(node.lineno)
        elif _is_member(node):
            lines.append(node.lineno)
    return sorted(set(lines))


def branches_under(root: Path) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for room in ROOMS:
        for path in sorted((root / room).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            if name.startswith(ALLOWED):
                continue
            lines = wire_branches(path.read_text())
            if lines:
                found[name] = lines
    return found


def test_no_wire_branch_outside_the_table() -> None:
    assert branches_under(REPO) == {}


@pytest.mark.parametrize(
    "source",
    [
        "if wire == Wire.ANTHROPIC: pass",
        "x = a if account.wire != 'openai' else b",
        "ok = spec is Wire.OPENAI",
        "match wire:\n    case Wire.OPENAI: pass",
        "match wire:\n    case 'anthropic': pass",
        "ENV = {Wire.ANTHROPIC: 1}",
        "def f():\n    return Wire.OPENAI",
    ],
)
def test_the_scan_sees_each_kind_of_branch(source: str) -> None:
    assert wire_branches(source) != []


def test_the_scan_passes_table_reads() -> None:
    assert (
        wire_branches(
            "spec = WIRES[account.wire]\nbody = spec.error_body(400, 'c', 'm', 'r')\n"
            "if spec.websocket_path is None: pass\nk = FACTS[wire].worker_env"
        )
        == []
    )


def test_only_the_table_imports_a_wire_module() -> None:
    """A wire's module is reached through the table; `websocket/events.py` reads the Responses
    socket's events, which only the OpenAI wire has (its `websocket_path`)."""
    modules = {f"dataplane.wires.{spec.name}" for spec in SPECS}
    offenders = []
    for path in sorted((REPO / "dataplane").rglob("*.py")) + sorted((REPO / "controlplane").rglob("*.py")):
        name = path.relative_to(REPO).as_posix()
        if name.startswith("dataplane/wires/") or name == "dataplane/websocket/events.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "dataplane.wires":
                if {f"dataplane.wires.{alias.name}" for alias in node.names} & modules:
                    offenders.append(name)
            elif isinstance(node, ast.ImportFrom) and node.module in modules:
                offenders.append(name)
    assert offenders == []


# ---- the table ------------------------------------------------------------------------------


def test_every_wire_has_its_facts_and_its_module() -> None:
    assert set(WIRES) == set(FACTS) == WIRE_STRINGS
    assert DEFAULT is WIRES[DEFAULT_WIRE]
    for name, spec in WIRES.items():
        assert isinstance(spec, WireSpec) and spec.facts is FACTS[name] and spec.name == name


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.name)
def test_a_wires_facts_hold_together(spec: WireSpec) -> None:
    facts = spec.facts
    assert spec.paths == facts.paths and spec.request_id_header == facts.request_id_header
    assert spec.model_paths == facts.model_paths and spec.usage_paths == facts.usage_paths
    assert facts.model_paths <= facts.paths and facts.usage_paths <= facts.paths
    assert all(path.startswith("/v1/") for path in facts.paths)
    assert facts.websocket_path is None or facts.websocket_path in facts.paths
    assert facts.request_id_header == facts.request_id_header.lower()
    assert facts.auth_styles and set(facts.auth_styles) <= set(AuthStyle)
    assert all(header == header.lower() for header in facts.sniff_headers)
    assert facts.base_path == "" or facts.base_path.startswith("/")
    url_var, key_var = facts.worker_env
    assert url_var.endswith("_BASE_URL") and key_var.endswith("_API_KEY")


def test_wires_differ_where_a_worker_or_a_keyless_request_tells_them_apart() -> None:
    envs = [spec.facts.worker_env for spec in SPECS]
    assert len(set(envs)) == len(envs)
    sniffs = [h for spec in SPECS for h in spec.facts.sniff_headers]
    assert len(set(sniffs)) == len(sniffs)


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.name)
def test_the_model_field_is_the_one_the_strict_reader_reads(spec: WireSpec) -> None:
    body = json.dumps({spec.facts.model_field: "m-1", "stream": False}).encode()
    assert strict_peek(body).model == "m-1"


def _codes(value: object) -> list[object]:
    if isinstance(value, dict):
        return [value.get("code"), *(c for v in value.values() for c in _codes(v))]
    return []


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 426, 429, 500, 502, 503, 504, 529])
@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.name)
def test_an_error_body_is_json_carrying_the_code_and_message(spec: WireSpec, status: int) -> None:
    body = json.loads(spec.error_body(status, "some-code", "a message", "req_1"))
    assert "some-code" in _codes(body) and "a message" in json.dumps(body)


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.name)
def test_a_cut_event_is_an_error_its_own_scanner_sees_on_every_path(spec: WireSpec) -> None:
    for path in sorted(spec.paths):
        event = spec.cut_event(path, "cut")
        assert event.endswith(b"\n\n") and event.count(b"\n\n") == 1
        scanner = spec.scanner(path)
        scanner.feed(event)
        assert scanner.seen.upstream_error and not scanner.seen.terminal, path


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.name)
def test_usage_from_a_body_it_cannot_read_is_none(spec: WireSpec) -> None:
    assert spec.usage_from_body(b"not json") == (None, None)
    assert spec.usage_from_body(b"{}") == (None, None)


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.name)
def test_rate_limit_headers_name_known_kinds_and_are_read(spec: WireSpec) -> None:
    names = spec.rate_limits.names
    assert names and {kind for kind, *_ in names} <= set(RATE_LIMIT_KINDS)
    assert all(h == h.lower() for _, *headers in names for h in headers)
    kind, limit, remaining, _ = names[0]
    headers = CIMultiDictProxy(CIMultiDict({limit: "10", remaining: "7"}))
    parsed = rate_limits_of(headers, spec.rate_limits, lambda: 1_800_000_000_000)
    assert parsed is not None and getattr(parsed, kind).remaining == 7


def _guess(path: str, headers: dict[str, str]) -> WireSpec:
    return guess_wire(path, CIMultiDictProxy(CIMultiDict(headers)))


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.name)
def test_a_keyless_request_is_answered_in_the_wire_its_path_or_headers_name(spec: WireSpec) -> None:
    others = set().union(*(other.paths for other in SPECS if other is not spec))
    for path in spec.paths - others:
        assert _guess(path, {}) is spec, path
    for header in spec.facts.sniff_headers:
        for path in ("/v1/models", "/v1/unknown"):
            assert _guess(path, {header: "x"}) is spec, (path, header)


def test_a_request_that_names_no_wire_is_answered_in_the_default() -> None:
    assert _guess("/v1/models", {}) is DEFAULT and _guess("/nowhere", {"authorization": "Bearer k"}) is DEFAULT


def test_the_426_names_every_wire_that_serves_the_websocket_and_only_those() -> None:
    for spec in SPECS:
        said = f"GET {spec.websocket_path} of an {spec.facts.title}-wire lease" in NOT_PROXIED
        assert said is (spec.websocket_path is not None), spec.name
    assert NOT_PROXIED.endswith("; use HTTP")


def test_the_connection_limit_answer_is_in_the_default_wires_shape() -> None:
    """Nothing of the request was read: the default wire's body and request id header, byte for
    byte as before the table (`x-request-id` on the OpenAI wire)."""
    from dataplane.main import connection_limit_answer

    head, body = connection_limit_answer().split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 503 Service Unavailable"
    fields = dict(line.split(": ", 1) for line in lines[1:])
    request_id = fields[DEFAULT.request_id_header]
    assert DEFAULT.request_id_header == "x-request-id" and request_id.startswith("req_")
    assert list(fields) == [
        "content-type",
        "retry-after",
        "connection",
        "x-should-retry",
        "x-request-id",
        "content-length",
    ]
    assert int(fields["content-length"]) == len(body)
    assert body == DEFAULT.error_body(
        503, "connection-limit", "the gateway has too many open connections; retry in a second", request_id
    )
