"""`leaseholdctl account ...` and `leaseholdctl audit` against real daemons (SPEC §9)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.support.harness import Gateway, Stub
from tests.system.test_ctl import MODEL, WHO, call, ctl, pairs


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, stub: Stub) -> Iterator[Gateway]:
    gateway = Gateway(tmp_path_factory.mktemp("ctl-admin"), stub).start()
    try:
        yield gateway
    finally:
        gateway.stop()


def state_of(gw: Gateway, account_id: str) -> str:
    accounts = json.loads(ctl(gw, "accounts", "--json").stdout)["accounts"]
    return next(a["administrative_state"] for a in accounts if a["id"] == account_id)


def test_disable_revoke_enable_and_audit(gw: Gateway, clean_stub: Stub) -> None:
    minted = gw.mint()  # a live key on legacy-anthropic before the account is disabled
    done = ctl(gw, "account", "disable", "legacy-anthropic", "--reason", "incident 7", "--actor", "ops")
    assert done.returncode == 0, done.stderr
    assert "using current revision 0" in done.stderr
    assert done.stdout.strip() == "legacy-anthropic: disabled; revision 1"
    assert state_of(gw, "legacy-anthropic") == "disabled"

    held = ctl(gw, "mint", "--v2", "--dispatch", "adm-1", *WHO, "--model", MODEL)
    assert held.returncode == 3 and "administrative-disabled" in pairs(held.stdout)["skipped"]
    assert call(gw, minted["token"]) == 200  # a live key keeps working until its leases are revoked

    stale = ctl(gw, "account", "enable", "legacy-anthropic", "--reason", "too early", "--expected-revision", "0")
    assert stale.returncode == 4 and "current revision is 1" in stale.stderr

    revoked = ctl(gw, "account", "revoke-leases", "legacy-anthropic", "--reason", "leak", "--expected-revision", "1")
    assert revoked.returncode == 0, revoked.stderr
    assert revoked.stdout.strip() == "legacy-anthropic: revoked 1 lease(s); revision 2"
    assert "using current revision" not in revoked.stderr
    assert call(gw, minted["token"]) == 401

    enabled = ctl(gw, "account", "enable", "legacy-anthropic", "--reason", "resolved", "--json")
    assert enabled.returncode == 0 and json.loads(enabled.stdout)["revision"] == 3
    assert state_of(gw, "legacy-anthropic") == "enabled"

    audit = ctl(gw, "audit", "--verify")
    assert audit.returncode == 0, audit.stderr
    lines = audit.stdout.splitlines()
    assert lines[0] == "chain verified, revision 3"
    assert [line.split()[3] for line in lines[2:]] == ["set-state", "revoke-leases", "set-state"]
    body = json.loads(ctl(gw, "audit", "--json").stdout)
    assert [r["reason"] for r in body["records"]] == ["incident 7", "leak", "resolved"]


def test_unknown_account_is_one_line(gw: Gateway) -> None:
    done = ctl(gw, "account", "drain", "no-such-account", "--reason", "x")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and "using current revision" in lines[0] and "no-such-account" in lines[-1]
    assert len(lines) == 2


def test_audit_verify_fails_on_a_tampered_chain(make_gateway, clean_stub: Stub) -> None:
    gw = make_gateway().start()
    assert ctl(gw, "audit", "--verify").returncode == 0  # absent is acceptable
    assert ctl(gw, "account", "drain", "legacy-openai", "--reason", "rotate").returncode == 0
    assert ctl(gw, "account", "enable", "legacy-openai", "--reason", "rotated").returncode == 0
    chain = gw.state_dir / "account-admin.jsonl"
    chain.write_text(chain.read_text().replace('"rotate"', '"nothing to see"', 1))
    done = ctl(gw, "audit", "--verify")
    assert done.returncode == 7
    assert "corrupt" in done.stdout and "does not verify" in done.stderr
    refused = ctl(gw, "account", "disable", "legacy-openai", "--reason", "x", "--expected-revision", "2")
    assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1
