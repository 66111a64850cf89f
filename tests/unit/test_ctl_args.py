"""leaseholdctl's argument handling: routes and bodies each invocation asks for, by tables."""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controlplane.cli.admin import mutation_request, verify_exit
from controlplane.cli.execute import exit_status, wire_of, worker_dispositions, worker_env
from controlplane.cli.exits import CtlError, Exit
from controlplane.cli.keys import mint_request
from controlplane.cli.policy import load_document
from controlplane.ctl import build_parser, main
from shared.codes import Wire
from shared.tracecontext import parse_traceparent

BASE = ["--principal", "w-1", "--repo", "acme/app"]


@dataclass(frozen=True)
class MintCase:
    name: str
    argv: list[str]
    expect: tuple[str, dict[str, Any]] | Exit


MINT_CASES = [
    MintCase(
        "v1",
        ["--binding", "zai-harness", *BASE],
        (
            "/control/v1/keys",
            {
                "provider_binding": "zai-harness",
                "principal_kind": "worker",
                "principal_id": "w-1",
                "repo_slug": "acme/app",
            },
        ),
    ),
    MintCase(
        "v1 with ttl and kind",
        ["--binding", "openai", "--principal-kind", "bot", "--ttl", "120", *BASE],
        (
            "/control/v1/keys",
            {
                "provider_binding": "openai",
                "principal_kind": "bot",
                "principal_id": "w-1",
                "repo_slug": "acme/app",
                "ttl_seconds": 120,
            },
        ),
    ),
    MintCase(
        "v2 by model",
        ["--v2", "--dispatch", "d-1", "--model", "claude-x", *BASE],
        (
            "/control/v2/mint",
            {
                "dispatch_id": "d-1",
                "repo_slug": "acme/app",
                "principal_kind": "worker",
                "principal_id": "w-1",
                "model": "claude-x",
            },
        ),
    ),
    MintCase(
        "v2 by class with role and retry",
        [
            "--v2",
            "--dispatch",
            "d-1",
            "--model-class",
            "fast",
            "--role",
            "coder",
            "--retry-of",
            "md_1",
            "--ttl",
            "600",
            *BASE,
        ],
        (
            "/control/v2/mint",
            {
                "dispatch_id": "d-1",
                "repo_slug": "acme/app",
                "principal_kind": "worker",
                "principal_id": "w-1",
                "worker_role": "coder",
                "model_class": "fast",
                "ttl_seconds": 600,
                "retry_of_mint_decision_id": "md_1",
            },
        ),
    ),
    MintCase(
        "v2 supersede",
        ["--v2", "--dispatch", "d-1", "--model", "m", "--supersedes", "md_2", *BASE],
        (
            "/control/v2/mint",
            {
                "dispatch_id": "d-1",
                "repo_slug": "acme/app",
                "principal_kind": "worker",
                "principal_id": "w-1",
                "model": "m",
                "supersedes_mint_decision_id": "md_2",
            },
        ),
    ),
    MintCase("no lane", BASE, Exit.USAGE),
    MintCase("v2 flag without --v2", ["--binding", "anthropic", "--model", "m", *BASE], Exit.USAGE),
    MintCase(
        "binding with --v2", ["--v2", "--binding", "anthropic", "--dispatch", "d", "--model", "m", *BASE], Exit.USAGE
    ),
    MintCase("v2 without dispatch", ["--v2", "--model", "m", *BASE], Exit.USAGE),
    MintCase("v2 without model", ["--v2", "--dispatch", "d", *BASE], Exit.USAGE),
]


@pytest.mark.parametrize("case", MINT_CASES, ids=lambda c: c.name)
def test_mint_request(case: MintCase) -> None:
    args = build_parser().parse_args(["mint", *case.argv])
    if isinstance(case.expect, Exit):
        with pytest.raises(CtlError) as caught:
            mint_request(args)
        assert caught.value.code == case.expect
    else:
        assert mint_request(args) == case.expect


@pytest.mark.parametrize(
    "argv",
    [
        ["mint", "--v2", "--dispatch", "d", "--model", "m", "--model-class", "c", *BASE],
        ["mint", "--v2", "--dispatch", "d", "--model", "m", "--retry-of", "a", "--supersedes", "b", *BASE],
        ["mint", "--binding", "bedrock", *BASE],
        ["routes", "--active", "--recent"],
        ["account", "pause", "acct", "--reason", "r"],
        ["account", "disable", "acct"],
        ["policy", "explain", "--model", "m"],
        ["nonsense"],
    ],
    ids=[
        "two models",
        "two citations",
        "unknown binding",
        "two route views",
        "unknown action",
        "no reason",
        "explain without repo",
        "unknown command",
    ],
)
def test_usage_errors_exit_2_without_traceback(argv: list[str], capsys) -> None:
    assert main(argv) == Exit.USAGE
    err = capsys.readouterr().err
    assert "usage:" in err and "Traceback" not in err


def test_help_lists_exit_codes(capsys) -> None:
    assert main(["--help"]) == Exit.OK
    out = capsys.readouterr().out
    for code in Exit:
        assert f"  {int(code)}  " in out
    assert "GATEWAY_CONTROL_URL" in out and "LEASEHOLD_TOKEN" in out


def test_exec_takes_everything_after_the_double_dash() -> None:
    args = build_parser().parse_args(
        ["exec", "--repo", "r", "--principal", "p", "--model", "m", "--", "tool", "--repo", "x", "-c", "--", "y"]
    )
    assert args.command == ["tool", "--repo", "x", "-c", "--", "y"] and args.repo == "r"


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (
            ["enable", "a-1"],
            (
                "PATCH",
                "/control/v2/accounts/a-1/state",
                {"state": "enabled", "reason": "r", "actor": "ops", "expected_revision": 4},
            ),
        ),
        (
            ["drain", "a-1"],
            (
                "PATCH",
                "/control/v2/accounts/a-1/state",
                {"state": "draining", "reason": "r", "actor": "ops", "expected_revision": 4},
            ),
        ),
        (
            ["disable", "a-1"],
            (
                "PATCH",
                "/control/v2/accounts/a-1/state",
                {"state": "disabled", "reason": "r", "actor": "ops", "expected_revision": 4},
            ),
        ),
        (
            ["revoke-leases", "a-1"],
            ("POST", "/control/v2/accounts/a-1/revoke-leases", {"reason": "r", "actor": "ops", "expected_revision": 4}),
        ),
    ],
    ids=["enable", "drain", "disable", "revoke-leases"],
)
def test_account_mutations(argv: list[str], expect: tuple) -> None:
    args = build_parser().parse_args(["account", *argv, "--reason", "r", "--expected-revision", "4"])
    assert mutation_request(args.action, args.account_id, args.reason, "ops", args.expected_revision) == expect


def test_mutation_without_actor_sends_none() -> None:
    assert "actor" not in mutation_request("enable", "a", "r", None, 0)[2]


@pytest.mark.parametrize(
    ("verdict", "code"),
    [("verified", Exit.OK), ("absent", Exit.OK), ("corrupt", Exit.UNVERIFIED), (None, Exit.UNVERIFIED)],
)
def test_verify_exit(verdict: str | None, code: Exit) -> None:
    assert verify_exit(verdict) == code


@pytest.mark.parametrize(("returncode", "status"), [(0, 0), (7, 7), (-2, 130), (-15, 143), (-1, 129), (-9, 137)])
def test_exit_status_follows_the_shell_convention(returncode: int, status: int) -> None:
    assert exit_status(returncode) == status


PARENT_ENV = {
    "PATH": "/usr/bin",
    "HOME": "/home/w",
    "GATEWAY_CONTROL_TOKEN": "c",
    "GATEWAY_TEAM_B_KEY": "sk-ant-x",
    "GATEWAY_CONTROL_URL": "http://127.0.0.1:8789",
    "LEASEHOLD_TOKEN": "l",
    "ANTHROPIC_API_KEY": "sk-ant-real",
    "ANTHROPIC_AUTH_TOKEN": "sk-ant-real2",
    "OPENAI_API_KEY": "sk-real",
    "CODEX_API_KEY": "sk-real2",
    "OPENAI_BASE_URL": "https://api.openai.com/v1",
}


@pytest.mark.parametrize(
    ("wire", "expect_added"),
    [
        (Wire.ANTHROPIC, {"ANTHROPIC_BASE_URL": "http://dp", "ANTHROPIC_API_KEY": "lhgw_t"}),
        (Wire.OPENAI, {"OPENAI_BASE_URL": "http://dp", "OPENAI_API_KEY": "lhgw_t"}),
    ],
    ids=["anthropic", "openai"],
)
def test_worker_env_holds_the_lease_and_nothing_else_secret(wire: Wire, expect_added: dict[str, str]) -> None:
    env = worker_env(PARENT_ENV, wire, "http://dp", "lhgw_t")
    kept = {"PATH": "/usr/bin", "HOME": "/home/w"}
    if wire == Wire.ANTHROPIC:
        kept["OPENAI_BASE_URL"] = "https://api.openai.com/v1"  # a URL is no secret; left as it was
    assert parse_traceparent(env.pop("TRACEPARENT")) is not None  # SPEC §21: a new trace
    assert env == {**kept, **expect_added}


def test_worker_env_keeps_the_callers_trace_and_replaces_a_bad_one() -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert worker_env({**PARENT_ENV, "TRACEPARENT": parent}, Wire.ANTHROPIC, "u", "t")["TRACEPARENT"] == parent
    fresh = worker_env({**PARENT_ENV, "TRACEPARENT": "nonsense"}, Wire.ANTHROPIC, "u", "t")["TRACEPARENT"]
    assert parse_traceparent(fresh) is not None and fresh != "nonsense"
    again = worker_env(PARENT_ENV, Wire.ANTHROPIC, "u", "t")["TRACEPARENT"]
    assert again.split("-")[1] != fresh.split("-")[1]  # each exec starts its own trace


def test_wire_of_account() -> None:
    view = {
        "accounts": [
            {"id": "legacy-zai-harness", "provider_binding": "zai-harness"},
            {"id": "oa", "provider_binding": "openai"},
        ]
    }
    assert wire_of(view, "legacy-zai-harness") == Wire.ANTHROPIC
    assert wire_of(view, "oa") == Wire.OPENAI
    with pytest.raises(CtlError):
        wire_of(view, "missing")


def test_policy_documents_by_extension(tmp_path: Path) -> None:
    toml = tmp_path / "team.toml"
    toml.write_text('account_order = ["a", "b"]\nrepos = ["acme/app"]\nlocks = ["providers"]\n')
    as_json = tmp_path / "team.json"
    as_json.write_text(json.dumps({"account_order": ["a", "b"], "repos": ["acme/app"], "locks": ["providers"]}))
    assert (
        load_document(str(toml))
        == load_document(str(as_json))
        == {"account_order": ["a", "b"], "repos": ["acme/app"], "locks": ["providers"]}
    )


@pytest.mark.parametrize(
    ("name", "content"),
    [("doc.yaml", "a: 1"), ("bad.toml", "a = "), ("bad.json", "{"), ("list.json", "[1]"), ("missing.toml", None)],
)
def test_policy_document_refusals(tmp_path: Path, name: str, content: str | None) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(CtlError) as caught:
        load_document(str(path))
    assert caught.value.code == Exit.USAGE and name in caught.value.message


def test_an_unexpected_error_is_still_one_line(monkeypatch, capsys) -> None:
    from controlplane.cli import views

    def boom(args: Any, client: Any) -> int:
        return {}["accounts"]  # what a surprising answer shape does to a formatter

    monkeypatch.setattr(views, "run_accounts", boom)
    monkeypatch.setenv("LEASEHOLD_TOKEN", "t")
    assert main(["accounts"]) == Exit.FAILED
    err = capsys.readouterr().err
    assert err.startswith("leaseholdctl: unexpected KeyError") and len(err.strip().splitlines()) == 1


# ---- exec's signal dispositions: passed through, as if CMD had been started directly -----

_HANDLER = lambda *_: None  # noqa: E731  (a Python handler of leaseholdctl's own)
DISPOSITION_CASES = [
    (
        "all at their defaults",
        {signal.SIGINT: signal.default_int_handler, signal.SIGHUP: signal.SIG_DFL, signal.SIGTERM: signal.SIG_DFL},
        {signal.SIGINT: signal.SIG_DFL, signal.SIGHUP: signal.SIG_DFL, signal.SIGTERM: signal.SIG_DFL},
    ),
    (
        "under nohup",
        {signal.SIGINT: signal.default_int_handler, signal.SIGHUP: signal.SIG_IGN, signal.SIGTERM: signal.SIG_DFL},
        {signal.SIGINT: signal.SIG_DFL, signal.SIGHUP: signal.SIG_IGN, signal.SIGTERM: signal.SIG_DFL},
    ),
    (
        "a background job under nohup",
        {signal.SIGINT: signal.SIG_IGN, signal.SIGHUP: signal.SIG_IGN, signal.SIGTERM: signal.SIG_DFL},
        {signal.SIGINT: signal.SIG_IGN, signal.SIGHUP: signal.SIG_IGN, signal.SIGTERM: signal.SIG_DFL},
    ),
    (
        "a handler or one set outside Python is not CMD's",
        {signal.SIGINT: _HANDLER, signal.SIGHUP: None, signal.SIGTERM: _HANDLER},
        {signal.SIGINT: signal.SIG_DFL, signal.SIGHUP: signal.SIG_DFL, signal.SIGTERM: signal.SIG_DFL},
    ),
]


@pytest.mark.parametrize(("name", "inherited", "expect"), DISPOSITION_CASES, ids=[c[0] for c in DISPOSITION_CASES])
def test_worker_dispositions(name: str, inherited: dict, expect: dict) -> None:
    assert worker_dispositions(inherited) == expect


def test_exec_help_says_what_happens_to_an_ignored_signal(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["exec", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "ignored by CMD too" in text and "send SIGTERM" in text and "nohup" in text
