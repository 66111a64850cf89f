"""The suite installs nothing while it runs (`make test` prepares chromium and the Node clients
before pytest starts), and a missing prerequisite is a failure under CI, a skip elsewhere."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.prerequisites import in_ci, missing

TESTS = Path(__file__).resolve().parents[1]
INSTALLERS = {"apt-get", "apt", "npm", "npx", "pip", "pip3"}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, False),
        ("", False),
        ("0", False),
        ("false", False),
        ("False", False),
        ("no", False),
        ("1", True),
        ("true", True),
        ("TRUE", True),
        ("yes", True),
    ],
)
def test_in_ci_reads_ci_as_ci_services_set_it(value: str | None, expected: bool) -> None:
    assert in_ci({} if value is None else {"CI": value}) is expected


def test_a_missing_prerequisite_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="chromium is missing; install it with: apt-get"):
        missing("chromium", "apt-get install -y chromium")


def test_a_missing_prerequisite_skips_naming_the_command_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="install it with: make test-clients"):
        missing("codex", "make test-clients")


def test_no_test_runs_an_installer() -> None:
    """No argv under tests/ starts with a package manager (`["apt-get", ...]`, `["npm", ...]`)."""
    offenders = []
    files = sorted(TESTS.rglob("*.py"))
    assert len(files) > 100
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.List)
                and node.elts
                and isinstance(node.elts[0], ast.Constant)
                and node.elts[0].value in INSTALLERS
            ):
                offenders.append(f"{path.relative_to(TESTS)}:{node.lineno}")
    assert not offenders, f"tests that run an installer (prepare it in the Makefile instead): {offenders}"
