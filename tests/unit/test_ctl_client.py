"""leaseholdctl's client: which token and URL, and how each unwanted answer reads.

Its real loopback I/O is `tests/integration/test_ctl_client_http.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from controlplane.cli.client import Client, Reply, TokenChoice, choose_token, control_url, error_of, failure_of
from controlplane.cli.exits import CtlError, Exit
from shared.codes import Scope

SECRET = "ctl_0123456789abcdefghijklmnopqrstuvwxyzABCD"


@dataclass(frozen=True)
class TokenCase:
    name: str
    flag: str | None
    env: dict[str, str]
    expect: TokenChoice


TOKEN_CASES = [
    TokenCase(
        "token file wins", "f", {"LEASEHOLD_TOKEN": "l", "GATEWAY_CONTROL_TOKEN": "c"}, TokenChoice("f", "--token-file")
    ),
    TokenCase(
        "leasehold before gateway",
        None,
        {"LEASEHOLD_TOKEN": "l", "GATEWAY_CONTROL_TOKEN": "c"},
        TokenChoice("l", "LEASEHOLD_TOKEN"),
    ),
    TokenCase(
        "control before mint",
        None,
        {"GATEWAY_MINT_TOKEN": "m", "GATEWAY_CONTROL_TOKEN": "c"},
        TokenChoice("c", "GATEWAY_CONTROL_TOKEN"),
    ),
    TokenCase(
        "mint before read",
        None,
        {"GATEWAY_MINT_TOKEN": "m", "GATEWAY_READ_TOKEN": "r"},
        TokenChoice("m", "GATEWAY_MINT_TOKEN"),
    ),
    TokenCase("read alone", None, {"GATEWAY_READ_TOKEN": "r"}, TokenChoice("r", "GATEWAY_READ_TOKEN")),
    TokenCase(
        "blank is unset",
        None,
        {"LEASEHOLD_TOKEN": "  ", "GATEWAY_READ_TOKEN": "r"},
        TokenChoice("r", "GATEWAY_READ_TOKEN"),
    ),
    TokenCase("none", None, {}, TokenChoice(None, "")),
]


@pytest.mark.parametrize("case", TOKEN_CASES, ids=lambda c: c.name)
def test_token_choice(case: TokenCase) -> None:
    assert choose_token(case.flag, case.env) == case.expect


@dataclass(frozen=True)
class UrlCase:
    name: str
    env: dict[str, str]
    expect: str


# SPEC §1: GATEWAY_CONTROL_URL, else http://$GATEWAY_CONTROL_LISTEN, else the default.
URL_CASES = [
    UrlCase("default", {}, "http://127.0.0.1:8789"),
    UrlCase("url set", {"GATEWAY_CONTROL_URL": "http://10.0.0.1:9000/"}, "http://10.0.0.1:9000"),
    UrlCase("url blank", {"GATEWAY_CONTROL_URL": ""}, "http://127.0.0.1:8789"),
    UrlCase(
        "url wins over listen",
        {"GATEWAY_CONTROL_URL": "https://ctl.internal", "GATEWAY_CONTROL_LISTEN": "127.0.0.1:9100"},
        "https://ctl.internal",
    ),
    UrlCase("listen alone", {"GATEWAY_CONTROL_LISTEN": "127.0.0.1:9100"}, "http://127.0.0.1:9100"),
    UrlCase(
        "listen when url blank",
        {"GATEWAY_CONTROL_URL": " ", "GATEWAY_CONTROL_LISTEN": "10.1.2.3:80"},
        "http://10.1.2.3:80",
    ),
    UrlCase("listen blank", {"GATEWAY_CONTROL_LISTEN": ""}, "http://127.0.0.1:8789"),
    UrlCase("listen on every v4 interface", {"GATEWAY_CONTROL_LISTEN": "0.0.0.0:9100"}, "http://127.0.0.1:9100"),
    UrlCase("listen on a v6 address", {"GATEWAY_CONTROL_LISTEN": "[::1]:9100"}, "http://[::1]:9100"),
    UrlCase("listen on every v6 interface", {"GATEWAY_CONTROL_LISTEN": "[::]:9100"}, "http://[::1]:9100"),
    UrlCase("listen by name", {"GATEWAY_CONTROL_LISTEN": "localhost:9100"}, "http://localhost:9100"),
]


@pytest.mark.parametrize("case", URL_CASES, ids=lambda c: c.name)
def test_control_url(case: UrlCase) -> None:
    assert control_url(case.env) == case.expect


@pytest.mark.parametrize("raw", ["127.0.0.1:8789", "ftp://x", "http://"])
def test_control_url_refuses_non_http(raw: str) -> None:
    with pytest.raises(CtlError) as caught:
        control_url({"GATEWAY_CONTROL_URL": raw})
    assert caught.value.code == Exit.USAGE and "GATEWAY_CONTROL_URL" in caught.value.message


@pytest.mark.parametrize("raw", ["9100", "127.0.0.1:", ":9100", "127.0.0.1:port", "127.0.0.1:70000"])
def test_control_url_refuses_a_malformed_listen_address_naming_it(raw: str) -> None:
    with pytest.raises(CtlError) as caught:
        control_url({"GATEWAY_CONTROL_LISTEN": raw})
    assert caught.value.code == Exit.USAGE and "GATEWAY_CONTROL_LISTEN" in caught.value.message


def _error(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


@dataclass(frozen=True)
class FailureCase:
    name: str
    reply: Reply
    scope: Scope
    source: str
    expect_code: Exit
    expect_words: tuple[str, ...]


FAILURES = [
    FailureCase(
        "401 names the variable and scope",
        Reply(401, {}, _error("unauthenticated", "x")),
        Scope.MINT,
        "GATEWAY_READ_TOKEN",
        Exit.AUTH,
        ("GATEWAY_READ_TOKEN", "401", "scope mint"),
    ),
    FailureCase(
        "403 names scope and the variable to use",
        Reply(403, {}, _error("forbidden-scope", "needs admin")),
        Scope.ADMIN,
        "GATEWAY_MINT_TOKEN",
        Exit.AUTH,
        ("GATEWAY_MINT_TOKEN", "scope admin", "GATEWAY_CONTROL_TOKEN"),
    ),
    FailureCase(
        "422 prints the server's message",
        Reply(422, {}, _error("invalid-request", "ttl_seconds >= 60")),
        Scope.MINT,
        "--token-file",
        Exit.FAILED,
        ("422", "ttl_seconds >= 60"),
    ),
    FailureCase(
        "409 revision conflict names the current revision",
        Reply(409, {}, _error("invalid-request", "m", current_revision=7, expected_revision=3)),
        Scope.ADMIN,
        "--token-file",
        Exit.REJECTED,
        ("current revision is 7", "not 3"),
    ),
    FailureCase(
        "409 other",
        Reply(409, {}, _error("fallback-lineage-mismatch", "no")),
        Scope.MINT,
        "--token-file",
        Exit.REJECTED,
        ("fallback-lineage-mismatch",),
    ),
    FailureCase(
        "plain 404 is a missing route",
        Reply(404, {}, "404: Not Found"),
        Scope.READ,
        "--token-file",
        Exit.FAILED,
        ("does not serve /p",),
    ),
    FailureCase(
        "coded 404 is the server's word",
        Reply(404, {}, _error("decision-unknown", "no live v2 lease")),
        Scope.MINT,
        "--token-file",
        Exit.FAILED,
        ("decision-unknown", "no live v2 lease"),
    ),
    FailureCase("500", Reply(500, {}, "boom"), Scope.READ, "--token-file", Exit.FAILED, ("500", "boom")),
]


@pytest.mark.parametrize("case", FAILURES, ids=lambda c: c.name)
def test_failure_lines(case: FailureCase) -> None:
    error = failure_of(case.reply, case.scope, TokenChoice(SECRET, case.source), "/p")
    assert error.code == case.expect_code
    for word in case.expect_words:
        assert word in error.message
    assert "\n" not in error.message and SECRET not in error.message


def test_error_of_reads_every_shape() -> None:
    assert error_of(_error("c", "m", current_revision=1)) == ("c", "m", {"current_revision": 1})
    assert error_of({"outcome": "held", "refusal_reason": "no-eligible-account"})[0] == "no-eligible-account"
    assert error_of("text body") == ("", "text body", {})
    assert error_of(None) == ("", "", {})


def test_no_token_is_an_auth_error_before_any_io() -> None:
    with pytest.raises(CtlError) as caught:
        Client("http://127.0.0.1:1", TokenChoice(None, "")).call("GET", "/x")
    assert caught.value.code == Exit.AUTH and "LEASEHOLD_TOKEN" in caught.value.message
