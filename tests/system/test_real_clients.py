"""Claude Code and Codex CLI, the real binaries from npm, through the gateway against the stub.

The clients live in a cache directory (`LEASEHOLD_TEST_CLIENTS`, default
`~/.cache/leasehold-test-clients`) that `make test` fills before pytest starts (`make
test-clients`); when they are missing the tests skip saying so, and fail under CI
(`tests/support/prerequisites.py`). Each client runs with a temporary home, its
non-essential traffic turned off (CLIENTS.md §4) and every proxy variable pointing at a closed
local port, so nothing but the gateway on 127.0.0.1 is reachable. Each run is bounded.

With the stub scripted to end one stream early, once with a clean close (which the gateway
turns into a broken stream) and once with an abrupt cut, each client retries and reports the
retried answer, never the truncated one.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.attempts import settled
from tests.support.harness import Gateway, Stub
from tests.support.prerequisites import CLIENTS_INSTALL, missing
from tests.support.stub_upstream import stub_text

CACHE = Path(os.environ.get("LEASEHOLD_TEST_CLIENTS", "~/.cache/leasehold-test-clients")).expanduser()
PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex"}
RUN_TIMEOUT_S = 120
# One more text delta than the stub's default: a client that accepted the cut stream would
# report this longer text instead of the retried answer.
CUT_DELTAS = 4


@pytest.fixture(scope="module")
def bins() -> dict[str, Path]:
    found = {name: CACHE / "node_modules" / ".bin" / name for name in PACKAGES}
    absent = [PACKAGES[name] for name, path in found.items() if not os.access(path, os.X_OK)]
    if absent:
        missing(" and ".join(absent) + f" (in {CACHE})", CLIENTS_INSTALL.format(cache=CACHE))
    return found


def client_env(home: Path, **extra: str) -> dict[str, str]:
    """A scrubbed environment: a temporary home, no route anywhere but loopback."""
    dead = "http://127.0.0.1:9"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "HTTPS_PROXY": dead,
        "HTTP_PROXY": dead,
        "ALL_PROXY": dead,
        "https_proxy": dead,
        "http_proxy": dead,
        "all_proxy": dead,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    env.update(extra)
    return env


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )


# ---- Claude Code --------------------------------------------------------------------------------


def claude_turn(bins: dict[str, Path], gw: Gateway, token: str, tmp: Path) -> dict:
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    env = client_env(
        home,
        ANTHROPIC_BASE_URL=gw.dataplane_url,
        ANTHROPIC_API_KEY=token,
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_AUTOUPDATER="1",
    )
    done = run([str(bins["claude"]), "-p", "say hi", "--output-format", "json"], home, env)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    return json.loads(done.stdout)


@pytest.mark.parametrize("fault", [None, "eof_after_events", "cut_after_events"])
def test_claude_code_completes_a_turn_and_retries_a_broken_stream(
    bins: dict[str, Path], gateway: Gateway, clean_stub: Stub, tmp_path: Path, fault: str | None
) -> None:
    minted = gateway.mint()
    # Both faults end the stream after two of its text deltas ("t0 t1 "): a clean close upstream
    # (which the gateway turns into a broken stream) and an abrupt cut. (A stream that lacks only
    # `message_stop` is taken as complete by Claude Code 2.1.332 even after the gateway's error
    # event and abort: its text and stop_reason were all delivered, so nothing is truncated.)
    if fault is not None:
        clean_stub.script({fault: 5, "deltas": CUT_DELTAS})
    result = claude_turn(bins, gateway, minted["token"], tmp_path)
    assert result["is_error"] is False and result["result"] == stub_text(), result

    seen = clean_stub.requests()
    assert seen and all(e["path"] == "/v1/messages?beta=true" for e in seen)
    first = seen[0]["headers"]
    assert first["x-api-key"] == clean_stub.anthropic_key and "authorization" not in first
    assert first["user-agent"].startswith("claude-cli/") and first["anthropic-beta"]
    assert all(minted["token"] not in json.dumps(e["headers"]) for e in seen)
    rows = settled(gateway, minted["key_id"], len(seen))
    if fault is None:
        assert [r["status"] for r in rows] == ["completed"] and rows[0]["stream"] is True
    else:
        assert rows[0]["status"] == "transport-error" and rows[-1]["status"] == "completed"
        assert len(rows) >= 2


# ---- Codex CLI ------------------------------------------------------------------------------------


def codex_turn(bins: dict[str, Path], gw: Gateway, token: str, tmp: Path) -> str:
    home, codex_home = tmp / "home", tmp / "codex-home"
    home.mkdir(exist_ok=True)
    codex_home.mkdir(exist_ok=True)
    (codex_home / "config.toml").write_text(
        'model = "gpt-5"\nmodel_provider = "leasehold"\ncheck_for_update_on_startup = false\n'
        "[analytics]\nenabled = false\n"
        "[model_providers.leasehold]\n"
        f'name = "Leasehold"\nbase_url = "{gw.dataplane_url}/v1"\n'
        'env_key = "LEASEHOLD_WORKER_KEY"\nwire_api = "responses"\n'
    )
    last = tmp / "last-message.txt"
    env = client_env(home, CODEX_HOME=str(codex_home), LEASEHOLD_WORKER_KEY=token)
    done = run(
        [
            str(bins["codex"]),
            "exec",
            "--skip-git-repo-check",
            "--disable",
            "plugins",
            "--disable",
            "apps",
            "-c",
            "analytics.enabled=false",
            "-c",
            "check_for_update_on_startup=false",
            "-o",
            str(last),
            "say hi",
        ],
        home,
        env,
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    return last.read_text()


@pytest.mark.parametrize("fault", [None, "eof_after_events", "cut_after_events"])
def test_codex_completes_a_turn_and_retries_a_broken_stream(
    bins: dict[str, Path], gateway: Gateway, clean_stub: Stub, tmp_path: Path, fault: str | None
) -> None:
    minted = gateway.mint("openai")
    if fault == "eof_after_events":  # everything but response.completed, then a clean close
        clean_stub.script({"eof_after_events": CUT_DELTAS + 7, "deltas": CUT_DELTAS})
    elif fault == "cut_after_events":
        clean_stub.script({"cut_after_events": 6, "deltas": CUT_DELTAS})
    assert codex_turn(bins, gateway, minted["token"], tmp_path).strip() == stub_text().strip()

    seen = clean_stub.requests()
    assert seen and all((e["method"], e["path"], e["stream"]) == ("POST", "/v1/responses", True) for e in seen)
    first = seen[0]["headers"]
    assert first["authorization"] == f"Bearer {clean_stub.openai_key}" and "x-api-key" not in first
    assert first["originator"] == "codex_exec"
    assert all(minted["token"] not in json.dumps(e["headers"]) for e in seen)
    rows = settled(gateway, minted["key_id"], len(seen))
    if fault is None:
        assert [r["status"] for r in rows] == ["completed"]
        assert rows[0]["usage"]["output_tokens"] == 3 and rows[0]["served_model"] == "gpt-5"
    else:
        assert rows[0]["status"] == "transport-error" and rows[-1]["status"] == "completed"
        assert len(rows) >= 2


# ---- Codex CLI over the Responses WebSocket (SPEC §20) ---------------------------------------------


def codex_socket_turn(bins: dict[str, Path], gw: Gateway, token: str, tmp: Path) -> str:
    """Codex's built-in OpenAI provider with `openai_base_url`: the socket first (CLIENTS.md)."""
    home, codex_home = tmp / "home", tmp / "codex-home"
    home.mkdir(exist_ok=True)
    codex_home.mkdir(exist_ok=True)
    (codex_home / "config.toml").write_text(
        f'model = "gpt-5"\ncheck_for_update_on_startup = false\nopenai_base_url = "{gw.dataplane_url}/v1"\n'
        "[analytics]\nenabled = false\n"
    )
    last = tmp / "last-message.txt"
    env = client_env(home, CODEX_HOME=str(codex_home), CODEX_API_KEY=token)
    done = run(
        [
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
    return last.read_text()


TOOL_CALL = {"ws_function_call": {"name": "shell", "arguments": '{"command": ["echo", "hi"]}'}}


@pytest.mark.parametrize("fault", [None, "tool-calls", "cut"])
def test_codex_over_the_socket_chains_turns_and_retries_a_cut(
    bins: dict[str, Path], gateway: Gateway, clean_stub: Stub, tmp_path: Path, fault: str | None
) -> None:
    minted = gateway.mint("openai")
    if fault == "tool-calls":  # two tool calls: each output comes back chained to the last response
        clean_stub.script({}, TOOL_CALL, TOOL_CALL)
    elif fault == "cut":  # the upstream socket dropped mid-turn: Codex reconnects and retries
        clean_stub.script({}, {"ws_cut_after_events": 5, "deltas": CUT_DELTAS})
    assert codex_socket_turn(bins, gateway, minted["token"], tmp_path).strip() == stub_text().strip()

    seen = clean_stub.requests()
    assert not [e for e in seen if e["method"] == "POST"]  # never fell back to HTTP
    creates = [e for e in seen if e["method"] == "WS"]
    assert creates[0]["generate"] is False  # the warmup, then the turn chained to it
    first = creates[0]["headers"]
    assert first["authorization"] == f"Bearer {clean_stub.openai_key}" and first["openai-beta"].startswith(
        "responses_websockets="
    )
    assert all(minted["token"] not in json.dumps(e["headers"]) for e in seen)
    rows = settled(gateway, minted["key_id"], len(creates))
    assert {r["transport"] for r in rows} == {"websocket"}
    if fault == "cut":
        assert [r["status"] for r in rows] == ["completed", "transport-error", "completed"]
        assert len([e for e in seen if e["method"] == "GET"]) == 2  # a new socket for the retry
    else:
        chained = [e["previous_response_id"] for e in creates[1:]]
        assert len(creates) == (4 if fault else 2) and all(chained)
        assert [r["status"] for r in rows] == ["completed"] * len(creates)
