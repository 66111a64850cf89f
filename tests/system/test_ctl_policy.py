"""`leaseholdctl policy get | set | explain | audit` against real daemons (SPEC §10)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.harness import Gateway, Stub
from tests.system.test_ctl import MODEL, ctl


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, stub: Stub) -> Iterator[Gateway]:
    gateway = Gateway(tmp_path_factory.mktemp("ctl-policy"), stub).start()
    try:
        yield gateway
    finally:
        gateway.stop()


def test_set_get_explain_and_audit_a_repo_level(gw: Gateway, tmp_path: Path) -> None:
    before = ctl(gw, "policy", "get")
    assert before.returncode == 0, before.stderr
    assert before.stdout.startswith("chain ")
    revision = json.loads(ctl(gw, "policy", "get", "--json").stdout)["revision"]

    doc = tmp_path / "repo.toml"
    doc.write_text('providers = ["anthropic"]\nfallback_on = ["rate-limited"]\n')
    done = ctl(gw, "policy", "set", "--level", "repo:acme/app", "--file", str(doc), "--reason", "anthropic only")
    assert done.returncode == 0, done.stderr
    assert f"using current revision {revision}" in done.stderr
    assert done.stdout.strip() == f"repo:acme/app: written; policy revision {revision + 1}"

    level = ctl(gw, "policy", "get", "--level", "repo:acme/app")
    assert level.returncode == 0 and '"anthropic"' in level.stdout and '"rate-limited"' in level.stdout

    explain = ctl(gw, "policy", "explain", "--repo", "acme/app", "--model", MODEL)
    assert explain.returncode == 0, explain.stderr
    assert "legacy-anthropic" in explain.stdout and "repo:acme/app" in explain.stdout
    assert "a mint now would select: legacy-anthropic" in explain.stdout
    assert json.loads(ctl(gw, "policy", "explain", "--repo", "acme/app", "--model", MODEL, "--json").stdout)

    stale = ctl(
        gw,
        "policy",
        "set",
        "--level",
        "repo:acme/app",
        "--file",
        str(doc),
        "--reason",
        "again",
        "--expected-revision",
        str(revision),
    )
    assert stale.returncode == 4 and "409" in stale.stderr

    audit = ctl(gw, "policy", "audit", "--verify")
    assert audit.returncode == 0, audit.stderr
    assert audit.stdout.startswith(f"chain verified, revision {revision + 1}")
    assert "repo:acme/app" in audit.stdout and "anthropic only" in audit.stdout


def test_an_unknown_field_is_refused_naming_it(gw: Gateway, tmp_path: Path) -> None:
    doc = tmp_path / "bad.json"
    doc.write_text(json.dumps({"colour": "blue"}))
    done = ctl(gw, "policy", "set", "--level", "platform", "--file", str(doc), "--reason", "x")
    assert done.returncode == 1 and "422" in done.stderr and "colour" in done.stderr


def test_a_bad_file_never_reaches_the_daemon(gw: Gateway, tmp_path: Path) -> None:
    doc = tmp_path / "bad.toml"
    doc.write_text("providers = [")
    done = ctl(
        gw, "policy", "set", "--level", "platform", "--file", str(doc), "--reason", "x", "--expected-revision", "0"
    )
    assert done.returncode == 2 and "not valid TOML" in done.stderr
