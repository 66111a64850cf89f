"""`make run`: control + data plane on an embedded default, ready to call.

State lives in `./var`; the control token is generated once and kept in `./var/control-token`.
For every provider whose credential is unset (`GATEWAY_ANTHROPIC_API_KEY`, `GATEWAY_ZAI_API_KEY`,
`GATEWAY_OPENAI_API_KEY`) the built-in stub upstream stands in, so the gateway answers with no
real key at all. Ctrl-C stops all three processes.
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
from pathlib import Path

from tests.support.harness import REPO, Proc, http
from tests.support.waits import wait_until

VAR = REPO / "var"


def _token() -> str:
    path = VAR / "control-token"
    if not path.exists():
        path.write_text("lhctl_" + secrets.token_urlsafe(32) + "\n")
        path.chmod(0o600)
    return path.read_text().strip()


def main() -> int:
    VAR.mkdir(exist_ok=True)
    env = dict(os.environ)
    env.setdefault("GATEWAY_STATE_DIR", str(VAR / "state"))
    env.setdefault("GATEWAY_RUNTIME_DIR", str(VAR / "run"))
    env.setdefault("GATEWAY_CONTROL_TOKEN", _token())
    env["PYTHONPATH"] = str(REPO)
    token = env["GATEWAY_CONTROL_TOKEN"]
    control_listen = env.setdefault("GATEWAY_CONTROL_LISTEN", "127.0.0.1:8789")
    dataplane_listen = env.setdefault("GATEWAY_DATAPLANE_LISTEN", "127.0.0.1:8788")
    procs: list[Proc] = []
    stubbed = [n for n in ("ANTHROPIC", "ZAI", "OPENAI") if not env.get(f"GATEWAY_{n}_API_KEY")]
    if stubbed:
        stub_key = "stub-" + secrets.token_hex(16)
        port_file = VAR / "stub.port"
        port_file.unlink(missing_ok=True)
        procs.append(
            Proc(
                [
                    sys.executable,
                    "-m",
                    "tests.support.stub_upstream",
                    "--port",
                    "0",
                    "--port-file",
                    str(port_file),
                    "--anthropic-key",
                    stub_key,
                    "--openai-key",
                    stub_key,
                ],
                env,
                VAR / "stub.log",
            )
        )
        port = wait_until(lambda: port_file.exists() and port_file.read_text().strip(), 20, "stub upstream")
        for name in stubbed:
            env[f"GATEWAY_{name}_BASE_URL"] = f"http://127.0.0.1:{port}"
            env[f"GATEWAY_{name}_API_KEY"] = stub_key
    bin_dir = Path(sys.executable).parent
    procs.append(Proc([str(bin_dir / "leasehold-control")], env, VAR / "control.log"))
    control_url = f"http://{control_listen}"
    try:
        wait_until(lambda: http("GET", control_url + "/healthz", timeout_s=2)[0] == 200, 20, "control daemon")
        procs.append(Proc([str(bin_dir / "leasehold-dataplane")], env, VAR / "dataplane.log"))
        wait_until(
            lambda: http("GET", control_url + "/healthz", timeout_s=2)[2]["dataplane_connected"], 20, "data plane"
        )
    except AssertionError as exc:
        print(f"make run: {exc}\nsee the logs in {VAR}/*.log", file=sys.stderr)
        for proc in reversed(procs):
            proc.stop()
        return 1
    print(banner(control_url, f"http://{dataplane_listen}", token, stubbed), flush=True)
    stop = {"now": False}
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    while not stop["now"] and all(p.alive for p in procs):
        signal.sigtimedwait([signal.SIGCHLD], 0.5) if hasattr(signal, "sigtimedwait") else None
    for proc in reversed(procs):
        proc.stop()
    print("\nstopped: data plane, control daemon" + (", stub upstream" if stubbed else ""))
    return 0


def banner(control_url: str, dataplane_url: str, token: str, stubbed: list[str]) -> str:
    upstream = (
        f"stub upstream standing in for: {', '.join(s.lower() for s in stubbed)}"
        if stubbed
        else "real provider credentials from your environment"
    )
    return f"""
Leasehold is running  ({upstream})
  control   {control_url}   (token in ./var/control-token; logs in ./var/*.log)
  dataplane {dataplane_url}

1. Mint a virtual key:
  curl -s -X POST {control_url}/control/v1/keys \\
    -H "Authorization: Bearer $(cat var/control-token)" -H 'Content-Type: application/json' \\
    -d '{{"provider_binding":"anthropic","principal_kind":"worker","principal_id":"me","repo_slug":"demo/repo"}}'

2. Call the data plane with it (curl):
  curl -s {dataplane_url}/v1/messages -H "x-api-key: $TOKEN" -H 'Content-Type: application/json' \\
    -d '{{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[{{"role":"user","content":"hello"}}]}}'

   or with the anthropic SDK (.venv/bin/python):
  import anthropic
  client = anthropic.Anthropic(base_url="{dataplane_url}", api_key=TOKEN)
  print(client.messages.create(model="claude-sonnet-4-6", max_tokens=64,
        messages=[{{"role": "user", "content": "hello"}}]).content[0].text)

3. See what was served:
  curl -s {control_url}/control/v2/routes/recent -H "Authorization: Bearer $(cat var/control-token)"

Ctrl-C stops everything.
"""


if __name__ == "__main__":
    sys.exit(main())
