"""Peers for `make bench-peers`: LiteLLM's proxy, installed on demand into its own venv.

Rule: a peer never touches the project's venv. LiteLLM is installed into `bench/.peers/litellm`
the first time it is asked for, at a pinned version (LiteLLM releases have been compromised
on PyPI and withdrawn; a pin keeps a run from silently picking up whatever is newest), and
configured to send `claude-sonnet-4-6` to the stub with the stub's key. Its outbound calls are
turned off (no cost-map download, no telemetry). Any failure — install, start, or a first
request — is reported and the run goes on without the column.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.procs import Servers, Target
from tests.support.harness import REPO, Proc, base_env, free_port, http, wait_until

PEERS_DIR = REPO / "bench" / ".peers"
LITELLM_SPEC = "litellm[proxy]==1.82.6"
INSTALL_TIMEOUT_S = 900
START_TIMEOUT_S = 180


class PeerUnavailable(Exception):
    pass


def ensure_litellm(spec: str, say) -> Path:
    """The `litellm` executable of a venv holding `spec`, installing it when missing."""
    venv = PEERS_DIR / "litellm"
    exe = venv / "bin" / "litellm"
    stamp = venv / ".installed-spec"
    if exe.exists() and stamp.exists() and stamp.read_text().strip() == spec:
        return exe
    say(f"installing {spec} into {venv} (first use; a few minutes) ...")
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", spec],
    ]
    for argv in steps:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise PeerUnavailable(f"`{' '.join(argv[-2:])}` timed out after {exc.timeout}s") from None
        if done.returncode != 0:
            raise PeerUnavailable(f"`{' '.join(argv[-2:])}` failed: {(done.stderr or done.stdout)[-800:]}")
    if not exe.exists():
        raise PeerUnavailable(f"{spec} installed no `litellm` executable")
    stamp.write_text(spec + "\n")
    return exe


def litellm_config(stub_url: str) -> dict[str, Any]:
    """LiteLLM's proxy config (JSON is YAML): one model, served by the stub, no retries."""
    return {
        "model_list": [
            {
                "model_name": "claude-sonnet-4-6",
                "litellm_params": {
                    "model": "anthropic/claude-sonnet-4-6",
                    "api_base": stub_url,
                    "api_key": "os.environ/BENCH_STUB_ANTHROPIC_KEY",
                },
            }
        ],
        "litellm_settings": {"num_retries": 0, "request_timeout": 600, "telemetry": False, "drop_params": True},
        "general_settings": {"master_key": "os.environ/BENCH_LITELLM_MASTER_KEY"},
    }


def start_litellm(exe: Path, workdir: Path, servers: Servers) -> tuple[Proc, int, str, float]:
    """Start LiteLLM's proxy; returns (process, port, master key, seconds to ready)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "litellm.yaml"
    config.write_text(json.dumps(litellm_config(servers.stub.url), indent=2))
    master = "sk-bench-" + secrets.token_hex(16)
    port = free_port()
    env = base_env()
    env.pop("PYTHONPATH", None)
    env.update(
        {
            "BENCH_STUB_ANTHROPIC_KEY": servers.stub.anthropic_key or "",
            "BENCH_LITELLM_MASTER_KEY": master,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
            "DISABLE_ADMIN_UI": "True",
            "LITELLM_LOG": "ERROR",
            "NO_DOCS": "True",
        }
    )
    t0 = time.perf_counter()
    proc = Proc(
        [str(exe), "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"],
        env,
        workdir / "litellm.log",
    )
    try:
        wait_until(
            lambda: not proc.alive or http("GET", f"http://127.0.0.1:{port}/health/liveliness", timeout_s=2)[0] == 200,
            START_TIMEOUT_S,
            "LiteLLM liveliness",
            interval_s=0.05,
        )
    except AssertionError as exc:
        proc.stop()
        raise PeerUnavailable(f"LiteLLM did not become live: {exc}") from None
    if not proc.alive:
        raise PeerUnavailable(f"LiteLLM exited at start: {proc.output()[-800:]}")
    return proc, port, master, time.perf_counter() - t0


def litellm_target(workdir: Path, servers: Servers, spec: str | None, say) -> tuple[dict[str, Any], Target | None]:
    """(what happened, the column or None). Never raises: a missing peer is reported, not fatal."""
    spec = spec or os.environ.get("BENCH_LITELLM_SPEC") or LITELLM_SPEC
    info: dict[str, Any] = {"litellm": {"spec": spec}}
    try:
        exe = ensure_litellm(spec, say)
        say("starting LiteLLM's proxy ...")
        proc, port, master, ready_s = start_litellm(exe, workdir / "litellm", servers)
        servers.add(proc.stop)
        headers = {
            "anthropic-version": "2023-06-01",
            "content-type": "application/json",
            "Authorization": f"Bearer {master}",
        }
        status, _, body = http(
            "POST",
            f"http://127.0.0.1:{port}/v1/messages",
            {"model": "claude-sonnet-4-6", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
            headers,
            timeout_s=60,
        )
        if status != 200:
            raise PeerUnavailable(f"LiteLLM answered {status} to a first /v1/messages: {str(body)[:300]}")
    except PeerUnavailable as exc:
        say(f"LiteLLM unavailable, continuing without it: {exc}")
        info["litellm"]["unavailable"] = str(exc)
        return info, None
    info["litellm"].update({"start_to_ready_s": round(ready_s, 2), "version": spec.split("==")[-1]})
    target = Target(
        name="litellm",
        host="127.0.0.1",
        port=port,
        path="/v1/messages",
        headers=headers,
        pids={"litellm": proc.popen.pid, "stub": servers.stub.proc.popen.pid},
        stream_step_header=False,
    )
    return info, target
