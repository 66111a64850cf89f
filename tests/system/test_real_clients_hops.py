"""Claude Code and Codex CLI, unchanged, on a dispatch key (SPEC §17): a 429 (with
`retry-after`), a 529 and a cut stream on account A end in a completed turn served by account B.

The clients keep one key and retry on their own; the gateway hops the key on the first
qualifying failure (Claude Code gives up after three 529s, so it must be the first), and the
client's own retry reaches the sibling. Each fault is scripted on A's stub only; B's answers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.attempts import settled
from tests.support.harness import REPO, Gateway, Stub, credential_like
from tests.support.stub_upstream import stub_text
from tests.system.test_real_clients import (  # noqa: F401 (fixture)
    CUT_DELTAS,
    bins,
    claude_turn,
    client_env,
    codex_turn,
    run,
)

FAULTS = {
    "429 with retry-after": {"status": 429, "headers": {"retry-after": "1"}},
    "529": {"status": 529},
    "cut stream": {"cut_after_events": 5, "deltas": CUT_DELTAS},
}


@pytest.fixture
def sibling(tmp_path: Path):
    upstream = Stub(
        tmp_path / "stub-b", anthropic_key=credential_like("sk-ant-api03-"), openai_key=credential_like("sk-proj-")
    )
    yield upstream
    upstream.stop()


@pytest.fixture
def pool(make_gateway, tmp_path: Path, sibling: Stub) -> Gateway:
    accounts = tmp_path / "accounts.toml"
    accounts.write_text(f'''
[[account]]
id = "anthropic-b"
provider_binding = "anthropic"
base_url = "{sibling.url}"
auth_style = "x-api-key"
credential_env = "GATEWAY_ANTHROPIC_B_KEY"
models = ["claude-*"]

[[account]]
id = "openai-b"
provider_binding = "openai"
base_url = "{sibling.url}"
auth_style = "bearer"
credential_env = "GATEWAY_OPENAI_B_KEY"
models = ["gpt-*"]
''')
    return make_gateway(
        {
            "GATEWAY_ACCOUNTS_FILE": str(accounts),
            "GATEWAY_ANTHROPIC_B_KEY": sibling.anthropic_key,
            "GATEWAY_OPENAI_B_KEY": sibling.openai_key,
        }
    ).start()


def dispatch_key(gw: Gateway, model: str) -> dict:
    status, _, minted = gw.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": "d-real",
            "repo_slug": "acme/app",
            "principal_kind": "worker",
            "principal_id": "w-1",
            "model": model,
            "fallback_driver": "gateway",
        },
    )
    assert status == 201, minted
    return minted


@pytest.mark.parametrize("fault", list(FAULTS))
def test_claude_code_turn_is_served_by_the_sibling_after_a_fault_on_a(
    bins, pool: Gateway, clean_stub: Stub, sibling: Stub, tmp_path: Path, fault: str
) -> None:
    minted = dispatch_key(pool, "claude-sonnet-4-6")
    assert minted["account_id"] == "legacy-anthropic"
    clean_stub.script(FAULTS[fault])
    result = claude_turn(bins, pool, minted["token"], tmp_path)
    assert result["is_error"] is False and result["result"] == stub_text(), result
    assert len(clean_stub.requests()) == 1 and sibling.requests()
    rows = settled(pool, minted["key_id"], 1 + len(sibling.requests()))
    assert rows[0]["account_id"] == "legacy-anthropic" and rows[0]["condition"] is not None
    assert rows[-1]["account_id"] == "anthropic-b" and rows[-1]["status"] == "completed"


@pytest.mark.parametrize("fault", list(FAULTS))
def test_codex_turn_is_served_by_the_sibling_after_a_fault_on_a(
    bins, pool: Gateway, clean_stub: Stub, sibling: Stub, tmp_path: Path, fault: str
) -> None:
    minted = dispatch_key(pool, "gpt-5")
    assert minted["account_id"] == "legacy-openai"
    step = dict(FAULTS[fault])
    if fault == "cut stream":
        step = {"cut_after_events": 6, "deltas": CUT_DELTAS}
    clean_stub.script(step)
    assert codex_turn(bins, pool, minted["token"], tmp_path).strip() == stub_text().strip()
    assert len(clean_stub.requests()) == 1 and sibling.requests()
    rows = settled(pool, minted["key_id"], 1 + len(sibling.requests()))
    assert rows[0]["account_id"] == "legacy-openai" and rows[0]["condition"] is not None
    assert rows[-1]["account_id"] == "openai-b" and rows[-1]["status"] == "completed"


def test_leaseholdctl_exec_runs_codex_on_the_socket_and_prints_the_hop(
    bins, pool: Gateway, clean_stub: Stub, sibling: Stub, tmp_path: Path
) -> None:
    """`leaseholdctl exec -v -- codex exec ...`: Codex opens the Responses WebSocket (SPEC §20); a
    rate limit on A hops the key, the socket closes 1012, Codex reconnects and B answers."""
    home, codex_home = tmp_path / "home", tmp_path / "codex-home"
    home.mkdir()
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        'model = "gpt-5"\ncheck_for_update_on_startup = false\n[analytics]\nenabled = false\n'
    )
    clean_stub.script({}, {"ws_error": {"code": "rate_limit_exceeded", "message": "Rate limit reached."}})
    env = client_env(
        home,
        CODEX_HOME=str(codex_home),
        PYTHONPATH=str(REPO),
        GATEWAY_CONTROL_URL=pool.control_url,
        LEASEHOLD_TOKEN=pool.control_token,
    )
    last = tmp_path / "last.txt"
    done = run(
        [
            sys.executable,
            "-m",
            "controlplane.ctl",
            "exec",
            "-v",
            "--repo",
            "acme/app",
            "--principal",
            "w-1",
            "--model",
            "gpt-5",
            "--",
            str(bins["codex"]),
            "exec",
            "--skip-git-repo-check",
            "--disable",
            "plugins",
            "--disable",
            "apps",
            "-o",
            str(last),
            "say hi",
        ],
        home,
        env,
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert last.read_text().strip() == stub_text().strip()
    assert "hop 1: legacy-openai -> openai-b" in done.stderr and "closed (1012)" in done.stderr, done.stderr
    assert not [e for e in clean_stub.requests() + sibling.requests() if e["method"] == "POST"]  # socket only
    assert [e["method"] for e in sibling.requests()] == ["GET", "WS"]
