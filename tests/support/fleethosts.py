"""Control daemons of one fleet in this process: each wired by the daemon's own `wire` over a
real redis-server, with its own state directory and host id (no listeners, no data plane).

`FleetHosts.add("h1")` builds and starts one (`FleetHost.start`: join, re-register, loops);
`crash(name)` ends one as a SIGKILL would (loops cancelled, no `leave`, clients closed), `stop`
as a SIGTERM would. The mint, revoke and expiry paths are the daemon's own (`MintDesk`,
`ControlService`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from controlplane.answers import MintAnswer
from controlplane.mintshapes import MintV2
from controlplane.registry import AccountSpec, Registry
from controlplane.wiring import Control
from shared.codes import AuthStyle, Binding
from tests.support.control import close_control, make_control
from tests.support.fleet import fleet_secret_file
from tests.support.redis_server import RedisServer

MODEL = "m-1"


def accounts(ceilings: dict[str, int | None]) -> list[AccountSpec]:
    return [
        AccountSpec(
            id=a,
            display_name=a,
            provider_binding=Binding.ANTHROPIC,
            base_url="http://x",
            auth_style=AuthStyle.X_API_KEY,
            credential_env=f"GATEWAY_{a.upper().replace('-', '_')}_KEY",
            models=("m-*",),
            lease_capacity=c,
        )
        for a, c in ceilings.items()
    ]


class FleetHosts:
    def __init__(self, root: Path, redis_url: str, fleet_id: str, specs: list[AccountSpec], *, ttl_s: int = 3) -> None:
        self.root = root
        self.redis_url = redis_url
        self.fleet_id = fleet_id
        self.specs = specs
        self.ttl_s = ttl_s
        self.env = {s.credential_env: "sk-test-" + s.id for s in specs}
        self.hosts: dict[str, Control] = {}
        self.secret_file = fleet_secret_file(root)

    def settings(self, name: str) -> dict[str, str]:
        return {
            "GATEWAY_FLEET_REDIS_URL": self.redis_url,
            "GATEWAY_FLEET_ID": self.fleet_id,
            "GATEWAY_HOST_ID": name,
            "GATEWAY_FLEET_HOST_TTL_SECONDS": str(self.ttl_s),
            "GATEWAY_FLEET_SECRET_FILE": str(self.secret_file),
        }

    def build(self, name: str) -> Control:
        return make_control(self.root / name, settings=self.settings(name), env=self.env, registry=Registry(self.specs))

    async def add(self, name: str) -> Control:
        control = self.build(name)
        assert control.fleet is not None
        await control.fleet.start()
        self.hosts[name] = control
        return control

    def __getitem__(self, name: str) -> Control:
        return self.hosts[name]

    async def crash(self, name: str) -> None:
        """As a SIGKILL: the loops stop, nothing is let go, the process's state is gone."""
        control = self.hosts.pop(name)
        assert control.fleet is not None
        for task in control.fleet._tasks:
            task.cancel()
        for task in control.fleet._tasks:
            try:
                await task
            except BaseException:
                pass
        await control.fleet.b.close()
        close_control(control)

    async def stop(self, name: str) -> None:
        control = self.hosts.pop(name)
        assert control.fleet is not None
        await control.fleet.stop()
        close_control(control)

    async def stop_all(self) -> None:
        for name in list(self.hosts):
            await self.stop(name)


async def mint(control: Control, dispatch: str, **fields: Any) -> MintAnswer:
    return await control.desk.mint_v2(
        MintV2(
            dispatch_id=dispatch, repo_slug="acme/app", principal_kind="worker", principal_id="p", model=MODEL, **fields
        )
    )


async def fleet_world(tmp_path: Path, ceilings: dict[str, int | None]) -> AsyncIterator[tuple[RedisServer, FleetHosts]]:
    """A real redis-server and the hosts a test adds over it (fleet id `t`), every host stopped
    and the server stopped afterwards: the body of a test module's `world` fixture."""
    server = RedisServer(tmp_path / "redis").start()
    hosts = FleetHosts(tmp_path, server.url, "t", accounts(ceilings))
    try:
        yield server, hosts
    finally:
        await hosts.stop_all()
        server.stop()
