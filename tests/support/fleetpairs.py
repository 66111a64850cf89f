"""N control + data plane pairs sharing one real redis-server: a fleet on loopback (SPEC §16).

Every pair gets its own `GATEWAY_HOST_ID` (`gw-a`, `gw-b`, ...), state and runtime directories
and ports, and all share the fleet's Redis URL and id, the accounts file and the control token —
what an operator's hosts share. `FleetPairs.start()` starts them one after another (each control
joins the fleet before it serves) and waits until every control sees every host live.

Times are short for the tests (`GATEWAY_FLEET_HOST_TTL_SECONDS=3`: a beat every second). Every
wait is a condition with a deadline (`tests/support/waits.py`); every process is stopped by
`stop()`.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from tests.support.fleet import fleet_secret_file
from tests.support.harness import Gateway, Stub, credential_like, http, start_all, stop_all
from tests.support.redis_server import RedisServer
from tests.support.waits import wait_until

HOST_TTL_S = 3
MODEL = "team-sonnet-1"  # served by the declared accounts only (not legacy-anthropic)


def accounts_toml(stub: Stub, *, lease_capacity: int | None = 2, extra: str = "") -> str:
    """Two declared Anthropic accounts on `stub`: `team-a` (with `lease_capacity`), `team-b`."""
    ceiling = "" if lease_capacity is None else f"lease_capacity = {lease_capacity}\n"
    return f'''
[[account]]
id = "team-a"
provider_binding = "anthropic"
base_url = "{stub.url}"
auth_style = "x-api-key"
credential_env = "GATEWAY_TEAM_A_KEY"
models = ["team-*"]
{ceiling}
[[account]]
id = "team-b"
provider_binding = "anthropic"
base_url = "{stub.url}"
auth_style = "x-api-key"
credential_env = "GATEWAY_TEAM_B_KEY"
models = ["team-*"]
{extra}'''


class FleetPairs:
    def __init__(
        self,
        workdir: Path,
        stub: Stub,
        redis: RedisServer,
        count: int,
        *,
        accounts: str | None = None,
        extra_env: dict[str, str] | None = None,
        fleet_id: str | None = None,
    ) -> None:
        self.workdir = workdir
        self.redis = redis
        self.fleet_id = fleet_id or "f" + secrets.token_hex(4)
        self.control_token = credential_like("ctl_")
        accounts_file = workdir / "accounts.toml"
        workdir.mkdir(parents=True, exist_ok=True)
        accounts_file.write_text(accounts if accounts is not None else accounts_toml(stub))
        self.shared_env = {
            "GATEWAY_FLEET_REDIS_URL": redis.url,
            "GATEWAY_FLEET_ID": self.fleet_id,
            "GATEWAY_FLEET_HOST_TTL_SECONDS": str(HOST_TTL_S),
            "GATEWAY_ACCOUNTS_FILE": str(accounts_file),
            "GATEWAY_FLEET_SECRET_FILE": str(fleet_secret_file(workdir)),
            "GATEWAY_TEAM_A_KEY": stub.anthropic_key or "",
            "GATEWAY_TEAM_B_KEY": stub.anthropic_key or "",
            "GATEWAY_CONTROL_TOKEN": self.control_token,
            "GATEWAY_CIRCUIT_COOLDOWN_SECONDS": "30",
            **(extra_env or {}),
        }
        self.stub = stub
        self.pairs = [self.make(chr(ord("a") + i)) for i in range(count)]

    def make(self, letter: str) -> Gateway:
        gw = Gateway(self.workdir / f"gw-{letter}", self.stub, {**self.shared_env, "GATEWAY_HOST_ID": f"gw-{letter}"})
        gw.control_token = self.control_token
        return gw

    def __getitem__(self, index: int) -> Gateway:
        return self.pairs[index]

    def start(self) -> FleetPairs:
        start_all(self.pairs)  # side by side, as a fleet's hosts start
        self.wait_hosts_live(len(self.pairs))
        return self

    def stop(self) -> None:
        stop_all(self.pairs)

    def wait_hosts_live(self, count: int, timeout_s: float = 15, among: list[Gateway] | None = None) -> None:
        for gw in among or self.pairs:
            wait_until(
                lambda gw=gw: fleet_of(gw).get("hosts_live") == count and fleet_of(gw)["state"] == "available",
                timeout_s,
                f"{count} live hosts seen by {gw.env['GATEWAY_HOST_ID']}",
            )


def fleet_of(gw: Gateway) -> dict[str, Any]:
    status, _, body = gw.api("GET", "/control/v2/fleet")
    assert status == 200, body
    return body


def mint(gw: Gateway, dispatch_id: str, **fields: Any) -> tuple[int, dict[str, str], dict[str, Any]]:
    body = {
        "dispatch_id": dispatch_id,
        "repo_slug": "acme/app",
        "principal_kind": "worker",
        "principal_id": "w-1",
        "model": MODEL,
        **fields,
    }
    return gw.api("POST", "/control/v2/mint", body)


def call(gw: Gateway, token: str, step: str | None = None) -> tuple[int, dict[str, str], Any]:
    headers = {"x-api-key": token, **({"x-stub-step": step} if step else {})}
    return http(
        "POST",
        gw.dataplane_url + "/v1/messages",
        {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        headers,
    )


def accounts(gw: Gateway) -> dict[str, Any]:
    status, _, body = gw.api("GET", "/control/v2/accounts")
    assert status == 200, body
    return body


def account(gw: Gateway, account_id: str) -> dict[str, Any]:
    return next(a for a in accounts(gw)["accounts"] if a["id"] == account_id)
