"""systemd/: the units verify, keep their hardening, and the env example matches the settings.

`systemd-analyze verify` checks a unit against the host's systemd; it needs the ExecStart
binaries, the EnvironmentFile and the standard targets to exist. They are laid out in a
throwaway `--root` (stub executables, an empty env file, a copy of the host's unit directory),
so the check has no side effect on this machine and needs no root. MemoryDenyWriteExecute=
is checked for real: both daemons run under the kernel's equivalent (PR_SET_MDWE) and serve a
stream.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shared.settings import KNOWN, SettingsError, load_settings
from tests.support.harness import REPO, Proc, Stub, http
from tests.support.waits import wait_until

SYSTEMD = REPO / "systemd"
UNITS = ("leasehold-control.service", "leasehold-dataplane.service")
ENV_EXAMPLE = SYSTEMD / "gateway.env.example"
ANALYZE = shutil.which("systemd-analyze")
HOST_UNIT_DIRS = [Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")]
# Default drain window (SPEC §2) plus the data plane's row flush and a margin.
DRAIN_DEFAULT_S = 30

needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed here")


def unit_entries(name: str) -> list[tuple[str, str, str]]:
    """(section, key, value) for every assignment of a unit file, in order (keys may repeat)."""
    entries, section = [], ""
    for raw in (SYSTEMD / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        entries.append((section, key.strip(), value.strip()))
    return entries


def values(name: str, key: str) -> list[str]:
    return [v for _, k, v in unit_entries(name) if k == key]


def env_example_names() -> list[str]:
    return re.findall(r"^#?(GATEWAY_[A-Z0-9_]+)=", ENV_EXAMPLE.read_text(), flags=re.MULTILINE)


def fake_root(tmp_path: Path) -> Path:
    """A --root for systemd-analyze: the host's units, our units, stub binaries, an env file."""
    root = tmp_path / "root"
    host_units = next((d for d in HOST_UNIT_DIRS if (d / "sysinit.target").exists()), None)
    if host_units is None:
        pytest.skip("no systemd unit directory with sysinit.target on this host")
    shutil.copytree(host_units, root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    for unit in UNITS:
        shutil.copy(SYSTEMD / unit, root / "etc/systemd/system" / unit)
        for exe in values(unit, "ExecStart") + values(unit, "ExecStartPost"):
            binary = root / exe.split()[0].lstrip("/")
            binary.parent.mkdir(parents=True, exist_ok=True)
            binary.write_text("#!/bin/sh\nexit 0\n")
            binary.chmod(0o755)
        for env_file in values(unit, "EnvironmentFile"):
            target = root / env_file.lstrip("-/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("")
    return root


@needs_analyze
def test_units_pass_systemd_analyze_verify_without_a_warning(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    done = subprocess.run(
        [ANALYZE, "verify", f"--root={root}", *(f"/etc/systemd/system/{u}" for u in UNITS)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "" and done.stderr.strip() == "", done.stdout + done.stderr


@needs_analyze
def test_units_security_exposure_stays_low(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    for unit in UNITS:
        done = subprocess.run(
            [
                ANALYZE,
                "security",
                "--offline=yes",
                f"--root={root}",
                "--threshold=20",
                "--no-pager",
                f"/etc/systemd/system/{unit}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr
        assert re.search(r"exposure level for \S+: [0-1]\.\d OK", done.stdout), done.stdout[-500:]


@pytest.mark.parametrize("unit", UNITS)
def test_unit_runs_as_the_fixed_user_with_the_shared_env_file_and_hardening(unit: str) -> None:
    assert values(unit, "User") == ["leasehold"] and values(unit, "Group") == ["leasehold"]
    assert values(unit, "DynamicUser") in ([], ["no"])
    assert values(unit, "EnvironmentFile") == ["/etc/leasehold/gateway.env"]
    assert values(unit, "ExecStart") == [f"/opt/leasehold/venv/bin/{unit.removesuffix('.service')}"]
    expected = {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes",
        "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
        "LockPersonality": "yes",
        "MemoryDenyWriteExecute": "yes",
        "CapabilityBoundingSet": "",
        "UMask": "0077",
        "Restart": "on-failure",
        "KillSignal": "SIGTERM",
    }
    for key, value in expected.items():
        assert values(unit, key) == [value], key
    assert "@system-service" in values(unit, "SystemCallFilter")


def test_only_control_owns_the_runtime_and_state_directories() -> None:
    control, dataplane = UNITS
    assert values(control, "RuntimeDirectory") == ["leasehold"]
    assert values(control, "RuntimeDirectoryMode") == ["0700"]
    assert values(control, "StateDirectory") == ["leasehold"]
    assert values(control, "StateDirectoryMode") == ["0700"]
    # A second owner of /run/leasehold would delete control's socket whenever it stopped.
    assert values(dataplane, "RuntimeDirectory") == [] and values(dataplane, "StateDirectory") == []


def test_dataplane_is_ordered_after_control_but_survives_its_restart() -> None:
    dataplane = UNITS[1]
    assert "leasehold-control.service" in " ".join(values(dataplane, "After")).split()
    assert "leasehold-control.service" in " ".join(values(dataplane, "Wants")).split()
    for binding in ("BindsTo", "Requires", "PartOf", "Requisite"):
        assert "leasehold-control.service" not in " ".join(values(dataplane, binding)), binding
    stop_s = int(values(dataplane, "TimeoutStopSec")[0])
    assert stop_s >= DRAIN_DEFAULT_S + 10


def test_control_starts_after_a_local_redis_it_wants_but_does_not_require() -> None:
    control = "leasehold-control.service"
    assert "redis-server.service" in " ".join(values(control, "After")).split()
    assert "redis-server.service" in " ".join(values(control, "Wants")).split()
    assert not any(values(control, key) for key in ("Requires", "BindsTo", "PartOf"))


def test_dataplane_is_active_only_once_its_healthz_says_synchronised() -> None:
    """ExecStartPost= runs the probe on the data plane's own /healthz (SPEC §12), within the
    start timeout; the probe module is the one tests/system/test_dataplane_health.py runs."""
    dataplane = UNITS[1]
    (post,) = values(dataplane, "ExecStartPost")
    argv = post.split()
    assert argv[:3] == ["/opt/leasehold/venv/bin/python", "-m", "dataplane.probe"]
    probe_s = float(argv[argv.index("--timeout") + 1])
    assert probe_s < int(values(dataplane, "TimeoutStartSec")[0])
    assert values(UNITS[0], "ExecStartPost") == []  # control is ready when it listens


def test_env_example_lists_every_known_variable_and_nothing_else() -> None:
    names = env_example_names()
    assert sorted(set(KNOWN) - set(names)) == []
    assert sorted(set(names) - set(KNOWN)) == []
    assert len(names) == len(set(names)), "a variable is listed twice"


def test_env_example_defaults_are_the_settings_defaults_and_the_token_is_required() -> None:
    active, documented = {}, {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        match = re.match(r"^(#?)(GATEWAY_[A-Z0-9_]+)=(.*)$", line)
        if not match:
            continue
        commented, name, value = match.groups()
        (documented if commented else active)[name] = value
    with pytest.raises(SettingsError) as refused:
        load_settings(active, role="control")
    assert any("GATEWAY_CONTROL_TOKEN" in p for p in refused.value.problems)
    token = {"GATEWAY_CONTROL_TOKEN": "bench-example-token"}
    defaults = {k: v for k, v in documented.items() if not v.startswith("<")}
    assert load_settings({**active, **defaults, **token}) == load_settings(token)


# ---- MemoryDenyWriteExecute= in practice ----------------------------------------------------

# Sets the kernel's MDWE flag (what MemoryDenyWriteExecute= enforces), proves a W+X mapping is
# now refused, then runs the daemon module in this same process.
MDWE_WRAPPER = """
import ctypes, mmap, runpy, sys
if ctypes.CDLL(None, use_errno=True).prctl(65, 1, 0, 0, 0) != 0:
    sys.exit(77)
try:
    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
except OSError:
    pass
else:
    sys.exit(78)
module = sys.argv[1]
sys.argv = [module]
runpy.run_module(module, run_name="__main__")
"""


def _mdwe_supported() -> bool:
    probe = subprocess.run(
        [sys.executable, "-c", MDWE_WRAPPER, "this_module_does_not_exist"], capture_output=True, timeout=30
    )
    return probe.returncode not in (77, 78)


def test_both_daemons_serve_a_stream_under_memory_deny_write_execute(make_gateway, clean_stub: Stub) -> None:
    if not sys.platform.startswith("linux") or not _mdwe_supported():
        pytest.skip("this kernel has no PR_SET_MDWE (Linux 6.3+) to emulate MemoryDenyWriteExecute=")
    gw = make_gateway()
    gw.control = Proc([sys.executable, "-c", MDWE_WRAPPER, "controlplane.main"], gw.env, gw.workdir / "control.log")
    wait_until(lambda: gw.healthz() is not None or not gw.control.alive, 20, "control healthz")
    gw.dataplane = Proc([sys.executable, "-c", MDWE_WRAPPER, "dataplane.main"], gw.env, gw.workdir / "dataplane.log")
    gw.wait_synchronised()
    token = gw.mint()["token"]
    headers = {"x-api-key": token, "anthropic-version": "2023-06-01"}
    body = {"model": "claude-sonnet-4-6", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    status, _, answer = http("POST", gw.dataplane_url + "/v1/messages", body, headers)
    assert status == 200 and answer["type"] == "message"
    status, _, events = http("POST", gw.dataplane_url + "/v1/messages", {**body, "stream": True}, headers)
    assert status == 200 and "event: message_stop" in events
    assert gw.control.alive and gw.dataplane.alive, gw.logs()[-2000:]
