"""leaseholdctl against real daemons: the CLI runs as a subprocess, exactly as an operator runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.harness import Gateway, Stub, base_env, credential_like, default_signals, free_port, http
from tests.support.waits import wait_until

MODEL = "claude-sonnet-4-6"
CTL = [sys.executable, "-m", "controlplane.ctl"]
WHO = ["--principal", "w-1", "--repo", "acme/app"]


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, stub: Stub) -> Iterator[Gateway]:
    """One gateway for the module, with a read token and a mint token besides the admin one."""
    gateway = Gateway(
        tmp_path_factory.mktemp("ctl"),
        stub,
        {"GATEWAY_READ_TOKEN": credential_like("read_"), "GATEWAY_MINT_TOKEN": credential_like("mint_")},
    )
    gateway.start()
    yield gateway
    gateway.stop()


def ctl_env(gw: Gateway, **extra: str) -> dict[str, str]:
    env = base_env()
    env.update({"GATEWAY_CONTROL_URL": gw.control_url, "GATEWAY_CONTROL_TOKEN": gw.control_token})
    env.update(extra)
    return env


def ctl(
    gw: Gateway, *argv: str, env: dict[str, str] | None = None, timeout_s: float = 60
) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [*CTL, *argv],
        env=env or ctl_env(gw),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def pairs(stdout: str) -> dict[str, str]:
    return {line.split(None, 1)[0]: line.split(None, 1)[1] for line in stdout.splitlines() if " " in line}


def call(gw: Gateway, token: str) -> int:
    return http(
        "POST",
        gw.dataplane_url + "/v1/messages",
        {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        {"x-api-key": token},
    )[0]


def lease_count(gw: Gateway) -> int:
    return sum(a["lease_count"] for a in gw.api("GET", "/control/v2/accounts")[2]["accounts"])


# ---- mint, revoke, renew ------------------------------------------------------------------


def test_mint_v1_revoke_and_revoke_again(gw: Gateway, clean_stub: Stub) -> None:
    done = ctl(gw, "mint", "--binding", "anthropic", *WHO)
    assert done.returncode == 0, done.stderr
    minted = pairs(done.stdout)
    assert minted["account"] == "legacy-anthropic" and minted["base_url"] == gw.dataplane_url
    assert minted["token"].startswith("lhgw_" + minted["key_id"] + ".")
    assert call(gw, minted["token"]) == 200

    done = ctl(gw, "revoke", minted["key_id"])
    assert (done.returncode, done.stdout.strip()) == (0, f"revoked {minted['key_id']}")
    assert call(gw, minted["token"]) == 401
    again = ctl(gw, "revoke", minted["key_id"], "--json")
    assert again.returncode == 0 and json.loads(again.stdout) == {"revoked": False}


def test_mint_v1_json_is_the_raw_answer(gw: Gateway) -> None:
    done = ctl(gw, "mint", "--binding", "openai", *WHO, "--json")
    body = json.loads(done.stdout)
    assert set(body) == {"token", "key_id", "account_id", "expires_at", "base_url"}
    assert body["account_id"] == "legacy-openai" and body["base_url"] == gw.dataplane_url + "/v1"
    assert ctl(gw, "revoke", body["key_id"]).returncode == 0


def test_a_422_prints_the_servers_message(gw: Gateway) -> None:
    done = ctl(gw, "mint", "--binding", "anthropic", *WHO, "--ttl", "5")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("leaseholdctl: refused (422 invalid-request)") and "ttl_seconds" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_mint_v2_selected_then_held_then_rejected(gw: Gateway) -> None:
    v2 = ["mint", "--v2", "--dispatch", "ctl-d1", *WHO]
    done = ctl(gw, *v2, "--model", MODEL)
    assert done.returncode == 0, done.stderr
    selected = pairs(done.stdout)
    assert selected["outcome"] == "selected"
    assert selected["account"] == "legacy-anthropic (position 0, hop 0)"
    assert selected["token"].startswith("lhgw_" + selected["key_id"]) and selected["skipped"] == "-"

    held = ctl(gw, *v2, "--model", MODEL)  # a second live lease for one dispatch is never granted
    assert held.returncode == 3
    assert pairs(held.stdout)["refusal"] == "fallback-lease-still-held"
    assert pairs(held.stdout)["Retry-After"].isdigit()
    held_json = ctl(gw, *v2, "--model", MODEL, "--json")
    assert held_json.returncode == 3 and json.loads(held_json.stdout)["outcome"] == "held"

    rejected = ctl(gw, "mint", "--v2", "--dispatch", "ctl-d2", *WHO, "--model", "llama-3")
    assert rejected.returncode == 4 and pairs(rejected.stdout)["refusal"] == "model-not-served"
    assert ctl(gw, "revoke", selected["key_id"]).returncode == 0


def test_renew_mints_a_successor_and_revokes_the_old_key(gw: Gateway, clean_stub: Stub) -> None:
    first = pairs(ctl(gw, "mint", "--v2", "--dispatch", "ctl-renew", *WHO, "--model", MODEL).stdout)
    done = ctl(gw, "renew", first["key_id"], "--revoke-old")
    assert done.returncode == 0, done.stderr
    second = pairs(done.stdout)
    assert second["outcome"] == "selected" and second["key_id"] != first["key_id"]
    assert second["account"] == first["account"]
    assert f"revoked the predecessor {first['key_id']}" in done.stderr
    assert call(gw, first["token"]) == 401 and call(gw, second["token"]) == 200
    unknown = ctl(gw, "renew", first["key_id"])
    assert unknown.returncode == 1 and "404 decision-unknown" in unknown.stderr
    assert ctl(gw, "revoke", second["key_id"]).returncode == 0


# ---- views --------------------------------------------------------------------------------


def test_accounts_table_and_json(gw: Gateway) -> None:
    done = ctl(gw, "accounts")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:4] == ["ID", "BINDING", "CONFIGURED", "ADMIN"]
    assert [line.split()[0] for line in lines[1:4]] == ["legacy-anthropic", "legacy-zai-harness", "legacy-openai"]
    assert lines[4].startswith("window 900s")
    body = json.loads(ctl(gw, "accounts", "--window", "60", "--json").stdout)
    assert body["window_seconds"] == 60 and len(body["accounts"]) == 3
    bad = ctl(gw, "accounts", "--window", "59")
    assert bad.returncode == 1 and "422" in bad.stderr and "60" in bad.stderr


def test_routes_recent_and_active(gw: Gateway, clean_stub: Stub) -> None:
    minted = gw.mint()
    assert call(gw, minted["token"]) == 200
    rows = wait_until(lambda: [r for r in gw.ledger() if r["key_id"] == minted["key_id"]], 10, "the ledger row")
    recent = ctl(gw, "routes", "--recent", "--limit", "200")
    assert recent.returncode == 0 and rows[0]["attempt_id"] in recent.stdout and "completed" in recent.stdout
    body = json.loads(ctl(gw, "routes", "--recent", "--json").stdout)
    assert any(r["attempt_id"] == rows[0]["attempt_id"] for r in body["routes"])
    active = ctl(gw, "routes")
    assert active.returncode == 0 and active.stdout.startswith("no route in flight")
    assert json.loads(ctl(gw, "routes", "--active", "--json").stdout)["count"] == 0
    gw.revoke(minted["key_id"])


def test_watch_draws_the_live_view(gw: Gateway) -> None:
    done = ctl(gw, "watch", "--count", "2", "--interval", "0.05")
    assert done.returncode == 0
    assert done.stdout.count("legacy-anthropic") == 2 and done.stdout.count("ROUTES IN FLIGHT") == 2


# ---- failures: one line, a named fix, an exit code ----------------------------------------


def test_unreachable_control_is_one_clear_line(gw: Gateway) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = ctl(gw, "accounts", env=ctl_env(gw, GATEWAY_CONTROL_URL=url))
    assert done.returncode == 5 and done.stdout == ""
    assert done.stderr.strip() == (
        f"leaseholdctl: cannot reach the control daemon at {url}: [Errno 111] "
        "Connection refused — is leasehold-control running? set GATEWAY_CONTROL_URL "
        "(or GATEWAY_CONTROL_LISTEN, as in gateway.env)"
    )
    watch = ctl(gw, "watch", "--count", "1", env=ctl_env(gw, GATEWAY_CONTROL_URL=url))
    assert watch.returncode == 0 and "cannot reach the control daemon" in watch.stdout
    assert "ID  " not in watch.stdout  # no empty table that reads as "no accounts"


def test_an_operator_who_sourced_gateway_env_needs_no_url(gw: Gateway) -> None:
    """SPEC §1: with only the daemons' own GATEWAY_CONTROL_LISTEN (a non-default port here),
    leaseholdctl finds control; GATEWAY_CONTROL_URL still wins when it is set."""
    env = base_env()
    env.update({"GATEWAY_CONTROL_LISTEN": gw.env["GATEWAY_CONTROL_LISTEN"], "GATEWAY_CONTROL_TOKEN": gw.control_token})
    assert gw.env["GATEWAY_CONTROL_LISTEN"] != "127.0.0.1:8789"
    done = ctl(gw, "accounts", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert "legacy-anthropic" in [a["id"] for a in json.loads(done.stdout)["accounts"]]
    elsewhere = f"http://127.0.0.1:{free_port()}"
    wins = ctl(gw, "accounts", env={**env, "GATEWAY_CONTROL_URL": elsewhere})
    assert wins.returncode == 5 and elsewhere in wins.stderr


def test_wrong_token_names_its_variable_and_never_prints_it(gw: Gateway, tmp_path: Path) -> None:
    wrong = credential_like("wrong_")
    token_file = tmp_path / "token"
    token_file.write_text(wrong + "\n")
    by_flag = ctl(gw, "accounts", "--token-file", str(token_file))
    assert by_flag.returncode == 6 and "token from --token-file" in by_flag.stderr and "401" in by_flag.stderr
    env = ctl_env(gw, LEASEHOLD_TOKEN=wrong)
    by_env = ctl(gw, "accounts", env=env)
    assert by_env.returncode == 6 and "LEASEHOLD_TOKEN" in by_env.stderr
    assert wrong not in by_flag.stderr + by_env.stderr


def test_a_token_file_is_read_and_a_token_on_the_command_line_is_refused(gw: Gateway, tmp_path: Path) -> None:
    """SPEC §19: leaseholdctl reads its token from GATEWAY_CONTROL_TOKEN or --token-file, never
    from its command line (the process listing shows it to every local user)."""
    token_file = tmp_path / "token"
    token_file.write_text(gw.control_token + "\n")
    env = base_env()
    env["GATEWAY_CONTROL_URL"] = gw.control_url
    done = ctl(gw, "accounts", "--json", "--token-file", str(token_file), env=env)
    assert done.returncode == 0, done.stderr
    assert "legacy-openai" in [a["id"] for a in json.loads(done.stdout)["accounts"]]
    exec_argv = ("exec", "--token", gw.control_token, "--repo", "r", "--principal", "p", "--model", MODEL, "--", "true")
    for argv in (("accounts", "--token", gw.control_token), exec_argv):
        refused = ctl(gw, *argv, env=env)
        assert refused.returncode == 2, refused.stderr
        assert "--token-file" in refused.stderr and "GATEWAY_CONTROL_TOKEN" in refused.stderr
        assert gw.control_token not in refused.stderr + refused.stdout
    missing = ctl(gw, "accounts", "--token-file", str(tmp_path / "absent"), env=env)
    assert missing.returncode == 6 and "--token-file" in missing.stderr


def test_token_outside_its_scope_names_the_scope_needed(gw: Gateway) -> None:
    env = base_env()
    env.update({"GATEWAY_CONTROL_URL": gw.control_url, "GATEWAY_READ_TOKEN": gw.env["GATEWAY_READ_TOKEN"]})
    done = ctl(gw, "mint", "--binding", "anthropic", *WHO, env=env)
    assert done.returncode == 6
    assert "GATEWAY_READ_TOKEN lacks scope mint" in done.stderr and "403" in done.stderr
    assert gw.env["GATEWAY_READ_TOKEN"] not in done.stderr
    assert ctl(gw, "accounts", env=env).returncode == 0  # read scope reads
    env["GATEWAY_MINT_TOKEN"] = gw.env["GATEWAY_MINT_TOKEN"]  # mint is preferred over read
    minted = ctl(gw, "mint", "--binding", "anthropic", *WHO, "--json", env=env)
    assert minted.returncode == 0, minted.stderr
    assert ctl(gw, "revoke", json.loads(minted.stdout)["key_id"], env=env).returncode == 0


# ---- exec ---------------------------------------------------------------------------------

PRINT_ENV_AND_CALL = r"""
import json, os, sys, urllib.request
print(json.dumps(dict(os.environ)))
base, key = (os.environ.get("ANTHROPIC_BASE_URL"), os.environ.get("ANTHROPIC_API_KEY"))
if base:
    body = json.dumps({"model": sys.argv[1], "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    request = urllib.request.Request(base + "/v1/messages", data=body.encode(), method="POST",
                                     headers={"x-api-key": key, "content-type": "application/json"})
    with urllib.request.urlopen(request) as response:
        print("STATUS", response.status)
sys.exit(int(sys.argv[2]))
"""


def exec_env(gw: Gateway) -> dict[str, str]:
    return ctl_env(
        gw,
        LEASEHOLD_TOKEN=gw.control_token,
        GATEWAY_TEAM_B_KEY=credential_like("sk-ant-api03-"),
        ANTHROPIC_AUTH_TOKEN="sk-ant-stale",
        OPENAI_API_KEY="sk-stale",
        KEEP_ME="1",
    )


def test_exec_runs_the_worker_on_a_scrubbed_env_and_revokes_the_lease(gw: Gateway, clean_stub: Stub) -> None:
    before = lease_count(gw)
    done = ctl(
        gw,
        "exec",
        "--repo",
        "acme/app",
        "--principal",
        "w-1",
        "--role",
        "coder",
        "--model",
        MODEL,
        "--",
        sys.executable,
        "-c",
        PRINT_ENV_AND_CALL,
        MODEL,
        "7",
        env=exec_env(gw),
    )
    assert done.returncode == 7, done.stderr  # the command's own status
    child_env = json.loads(done.stdout.splitlines()[0])
    assert [k for k in child_env if k.startswith("GATEWAY_")] == []
    assert "LEASEHOLD_TOKEN" not in child_env and "ANTHROPIC_AUTH_TOKEN" not in child_env
    assert "OPENAI_API_KEY" not in child_env and child_env["KEEP_ME"] == "1"
    assert child_env["ANTHROPIC_BASE_URL"] == gw.dataplane_url
    token = child_env["ANTHROPIC_API_KEY"]
    assert token.startswith("lhgw_") and token not in done.stderr
    assert "STATUS 200" in done.stdout  # the worker reached the upstream through its lease
    assert call(gw, token) == 401  # revoked when the command exited
    assert lease_count(gw) == before


def test_exec_picks_the_openai_pair_for_an_openai_account(gw: Gateway) -> None:
    done = ctl(
        gw,
        "exec",
        "--repo",
        "acme/app",
        "--principal",
        "w-1",
        "--model",
        "gpt-4o-mini",
        "--",
        sys.executable,
        "-c",
        PRINT_ENV_AND_CALL,
        "gpt-4o-mini",
        "0",
        env=exec_env(gw),
    )
    assert done.returncode == 0, done.stderr
    child_env = json.loads(done.stdout.splitlines()[0])
    assert child_env["OPENAI_BASE_URL"] == gw.dataplane_url + "/v1"
    assert child_env["OPENAI_API_KEY"].startswith("lhgw_") and "ANTHROPIC_API_KEY" not in child_env
    assert call(gw, child_env["OPENAI_API_KEY"]) == 401


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_exec_forwards_signals_and_returns_128_plus_n(gw: Gateway, tmp_path: Path, sig: signal.Signals) -> None:
    ready = tmp_path / "ready"
    child = (
        "import json, os, pathlib, sys, time; pathlib.Path(sys.argv[1]).write_text("
        "json.dumps([os.getpid(), os.environ['ANTHROPIC_API_KEY']])); time.sleep(60)"
    )
    proc = subprocess.Popen(
        [
            *CTL,
            "exec",
            "--repo",
            "acme/app",
            "--principal",
            "w-1",
            "--model",
            MODEL,
            "--",
            sys.executable,
            "-c",
            child,
            str(ready),
        ],
        env=exec_env(gw),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_signals,
    )  # not pytest's: it may run under nohup, in `&`
    try:
        pid, token = json.loads(wait_until(lambda: ready.exists() and ready.read_text(), 20, "the worker"))
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, err
    assert not running(pid)  # the worker got the signal and was reaped before leaseholdctl returned
    assert call(gw, token) == 401


REPORT_DISPOSITIONS = (
    "import json, pathlib, signal, sys, time\n"
    "names = {signal.SIG_IGN: 'ignored', signal.SIG_DFL: 'default', signal.default_int_handler: 'default'}\n"
    "seen = {s.name: names.get(signal.getsignal(s), 'handled') "
    "for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)}\n"
    # (Python itself turns an inherited default SIGINT into default_int_handler)
    "signal.signal(signal.SIGHUP, lambda *_: sys.exit(42))\n"  # this worker handles SIGHUP itself
    "pathlib.Path(sys.argv[1]).write_text(json.dumps(seen))\n"
    "time.sleep(60)\n"
)


@pytest.mark.parametrize("started", ["default", "ignored"])
def test_exec_passes_its_signal_dispositions_to_the_worker_and_still_forwards(
    gw: Gateway, tmp_path: Path, started: str
) -> None:
    """As `exec --help` says: the worker starts with SIGINT/SIGHUP ignored when leaseholdctl was
    (nohup, a background job), at their defaults otherwise; a forwarded signal still reaches a
    worker that handles it itself."""
    ready = tmp_path / "ready"

    def start_as() -> None:  # how leaseholdctl's own parent left its dispositions
        for sig in (signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN if started == "ignored" else signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    proc = subprocess.Popen(
        [
            *CTL,
            "exec",
            "--repo",
            "acme/app",
            "--principal",
            "w-1",
            "--model",
            MODEL,
            "--",
            sys.executable,
            "-c",
            REPORT_DISPOSITIONS,
            str(ready),
        ],
        env=exec_env(gw),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=start_as,
    )
    try:
        seen = json.loads(wait_until(lambda: ready.exists() and ready.read_text(), 20, "the worker"))
        assert seen == {"SIGINT": started, "SIGHUP": started, "SIGTERM": "default"}
        proc.send_signal(signal.SIGHUP)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 42, err  # the worker's own status: its handler got the forwarded SIGHUP


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_exec_held_mint_runs_nothing(gw: Gateway, tmp_path: Path) -> None:
    first = pairs(ctl(gw, "mint", "--v2", "--dispatch", "ctl-busy", *WHO, "--model", MODEL).stdout)
    marker = tmp_path / "ran"
    done = ctl(
        gw,
        "exec",
        "--repo",
        "acme/app",
        "--principal",
        "w-1",
        "--model",
        MODEL,
        "--dispatch",
        "ctl-busy",
        "--",
        sys.executable,
        "-c",
        f"open({str(marker)!r}, 'w')",
        env=exec_env(gw),
    )
    assert done.returncode == 3 and not marker.exists()
    assert "mint held: fallback-lease-still-held" in done.stderr and "Retry-After" in done.stderr
    assert ctl(gw, "revoke", first["key_id"]).returncode == 0


def test_exec_of_a_missing_command_is_127_and_revokes(gw: Gateway) -> None:
    before = lease_count(gw)
    done = ctl(
        gw,
        "exec",
        "--repo",
        "acme/app",
        "--principal",
        "w-1",
        "--model",
        MODEL,
        "--",
        "/nonexistent/worker",
        env=exec_env(gw),
    )
    assert done.returncode == 127 and "command not found" in done.stderr
    assert lease_count(gw) == before


def _read_until(fd: int, marker: bytes, timeout_s: float) -> bytes:
    """Read a pty master until `marker` shows up (select with a deadline: never a bare sleep)."""
    import select
    import time

    seen = b""
    deadline = time.monotonic() + timeout_s
    while marker not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"timed out waiting for {marker!r}; got {seen!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: every slave end closed
                break
            if not chunk:
                break
            seen += chunk
    return seen


def test_exec_hands_the_terminal_to_the_worker_so_ctrl_c_reaches_it_once(gw: Gateway) -> None:
    """Interactive use: the worker owns the terminal (its reads work), Ctrl-C reaches it, and
    leaseholdctl takes the terminal back, revokes, and returns 128 + SIGINT."""
    import fcntl
    import termios

    master, slave = os.openpty()

    def controlling_tty() -> None:  # the test's ctl becomes a session leader owning the pty
        default_signals()  # Ctrl-C must be able to reach the worker, however pytest was started
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    worker = (
        "import os, sys, time; print('FG', os.tcgetpgrp(0) == os.getpgrp(), "
        "os.environ['ANTHROPIC_API_KEY'], 'READY', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen(
        [
            *CTL,
            "exec",
            "--repo",
            "acme/app",
            "--principal",
            "w-1",
            "--model",
            MODEL,
            "--",
            sys.executable,
            "-c",
            worker,
        ],
        env=exec_env(gw),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        preexec_fn=controlling_tty,
    )
    os.close(slave)
    try:
        line = _read_until(master, b"READY", 20).decode()
        words = line[line.index("FG") :].split()
        assert words[1] == "True", line  # the worker's group is the terminal's foreground group
        os.write(master, b"\x03")  # Ctrl-C, delivered by the terminal to its foreground group
        assert proc.wait(20) == 128 + signal.SIGINT
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert call(gw, words[2]) == 401
