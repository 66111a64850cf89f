"""Startup refusals from the console scripts: a clear message naming what to fix, exit 2."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.harness import Gateway, Stub, base_env, free_port

BIN = Path(sys.executable).parent


def run_control(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    full = {
        **base_env(),
        "GATEWAY_CONTROL_TOKEN": "control-token-for-startup-tests",
        "GATEWAY_STATE_DIR": str(tmp_path / "state"),
        "GATEWAY_RUNTIME_DIR": str(tmp_path / "run"),
        "GATEWAY_CONTROL_LISTEN": f"127.0.0.1:{free_port()}",
        **env,
    }
    return subprocess.run([str(BIN / "leasehold-control")], env=full, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize(
    "variable,value",
    [("GATEWAY_KEY_TTL_SECONDS", "5"), ("GATEWAY_FALLBACK_ON", "nope"), ("GATEWAY_CONTROL_LISTEN", "localhost")],
)
def test_a_bad_setting_names_its_variable(tmp_path: Path, variable: str, value: str) -> None:
    result = run_control(tmp_path, **{variable: value})
    assert result.returncode == 2 and variable in result.stderr


def test_a_missing_control_token_is_refused(tmp_path: Path) -> None:
    result = run_control(tmp_path, GATEWAY_CONTROL_TOKEN="")
    assert result.returncode == 2 and "GATEWAY_CONTROL_TOKEN" in result.stderr


def test_a_bad_accounts_file_names_file_entry_and_field(tmp_path: Path) -> None:
    accounts = tmp_path / "accounts.toml"
    accounts.write_text(
        '[[account]]\nid = "legacy-openai"\nprovider_binding = "openai"\nbase_url = "https://x"\n'
        'auth_style = "bearer"\ncredential_env = "GATEWAY_X_KEY"\nmodels = ["gpt-*"]\n'
    )
    result = run_control(tmp_path, GATEWAY_ACCOUNTS_FILE=str(accounts))
    assert result.returncode == 2
    assert str(accounts) in result.stderr and "account[0]" in result.stderr and "id" in result.stderr


def test_a_shared_socket_directory_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    result = run_control(tmp_path, GATEWAY_RPC_SOCKET=str(shared / "control.sock"))
    assert result.returncode == 2 and "GATEWAY_RPC_SOCKET" in result.stderr


def test_a_taken_port_names_the_listen_variable(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = run_control(tmp_path, GATEWAY_CONTROL_LISTEN=f"127.0.0.1:{port}")
    assert result.returncode == 2 and "GATEWAY_CONTROL_LISTEN" in result.stderr


def test_the_data_plane_names_its_listen_variable_when_the_port_is_taken(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        env = {
            **base_env(),
            "GATEWAY_RUNTIME_DIR": str(tmp_path / "run"),
            "GATEWAY_DATAPLANE_LISTEN": f"127.0.0.1:{port}",
        }
        result = subprocess.run([str(BIN / "leasehold-dataplane")], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "GATEWAY_DATAPLANE_LISTEN" in result.stderr


def test_a_bad_prices_file_names_file_entry_and_field(tmp_path: Path) -> None:
    prices = tmp_path / "prices.toml"
    prices.write_text(
        '[[price]]\nmodels = ["claude-*"]\ninput = 3.0\noutput = 15.0\ncache_read = 0.3\n'
        'cache_creation = 3.75\n\n[[price]]\nmodels = ["house-*"]\ninput = -1\noutput = 1\n'
        "cache_read = 0\ncache_creation = 0\n"
    )
    result = run_control(tmp_path, GATEWAY_PRICES_FILE=str(prices))
    assert result.returncode == 2
    assert str(prices) in result.stderr and "price[1] (house-*)" in result.stderr and "`input`" in result.stderr


def test_a_missing_prices_file_is_refused(tmp_path: Path) -> None:
    result = run_control(tmp_path, GATEWAY_PRICES_FILE=str(tmp_path / "absent.toml"))
    assert result.returncode == 2 and "GATEWAY_PRICES_FILE" in result.stderr


FLEET_SECRET = "GATEWAY_FLEET_SECRET_FILE"
SECRET_CONTENT = b"sk-fleet-" + b"Zq8w" * 12  # credential-shaped: stderr may never quote it


@pytest.mark.parametrize("daemon", ["leasehold-dataplane", "leasehold-control"])
@pytest.mark.parametrize("secret", ["unset", "world-readable", "short"])
def test_a_fleet_daemon_without_a_good_fleet_secret_exits_2_naming_it(tmp_path: Path, daemon: str, secret: str) -> None:
    """SPEC §19: fleet mode requires the secret of both daemons. A data plane without it would
    believe unsealed heartbeats, so a Redis writer could lift its host's lapse. Refused at
    settings, before any connection: the Redis URL names a closed loopback port."""
    env = {
        **base_env(),
        "GATEWAY_CONTROL_TOKEN": "control-token-for-startup-tests",
        "GATEWAY_STATE_DIR": str(tmp_path / "state"),
        "GATEWAY_RUNTIME_DIR": str(tmp_path / "run"),
        "GATEWAY_CONTROL_LISTEN": f"127.0.0.1:{free_port()}",
        "GATEWAY_DATAPLANE_LISTEN": f"127.0.0.1:{free_port()}",
        "GATEWAY_FLEET_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
    }
    if secret != "unset":
        path = tmp_path / "fleet-secret"
        path.write_bytes(SECRET_CONTENT if secret == "world-readable" else SECRET_CONTENT[:31])
        path.chmod(0o644 if secret == "world-readable" else 0o600)
        env[FLEET_SECRET] = str(path)
    result = subprocess.run([str(BIN / daemon)], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert FLEET_SECRET in result.stderr and "Zq8w" not in result.stderr + result.stdout


def test_daemons_stopped_right_after_their_start_exit_cleanly(tmp_path: Path, stub: Stub) -> None:
    """A stop just after ready exits 0. The data plane once crashed (-11, SIGSEGV) in 3 of 8
    such stops: the thread reading its CA bundle (`shared.deferred_ca.read_in_background`) was a
    daemon thread, still in OpenSSL while the interpreter finalized."""
    codes = []
    for n in range(8):
        gateway = Gateway(tmp_path / f"gw{n}", stub)
        try:
            gateway.start()
            assert gateway.control is not None and gateway.dataplane is not None
            codes.append((gateway.dataplane.stop(), gateway.control.stop()))
        finally:
            gateway.stop()  # whatever a failed start left running
    assert codes == [(0, 0)] * 8
