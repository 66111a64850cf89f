"""`make fleet-demo`: a local fleet on loopback — one redis-server and two pairs sharing it.

State lives in `./var/fleet` (each pair's own state and runtime dirs, the redis-server's
directory, every log); both pairs share the control token (`./var/fleet/control-token`), the
fleet secret (`./var/fleet/fleet-secret`: every control and every data plane reads it, SPEC §19),
the accounts file (`team-a` with `lease_capacity = 2`,
`team-b`, both on the built-in stub upstream) and the fleet's Redis. It prints what to call,
then waits; Ctrl-C (or SIGTERM) stops every process it started: both data planes, both
controls (each leaves the fleet), Redis, the stub.
"""

from __future__ import annotations

import secrets
import signal
import sys

from tests.support.fleetpairs import MODEL, FleetPairs
from tests.support.harness import REPO, Stub
from tests.support.redis_server import RedisServer, ServerExited

VAR = REPO / "var" / "fleet"


def _token() -> str:
    path = VAR / "control-token"
    if not path.exists():
        path.write_text("lhctl_" + secrets.token_urlsafe(32) + "\n")
        path.chmod(0o600)
    return path.read_text().strip()


def main() -> int:
    VAR.mkdir(parents=True, exist_ok=True)
    stub = Stub(VAR / "stub", anthropic_key="stub-" + secrets.token_hex(16), openai_key=None)
    started: list[object] = [stub]
    try:
        redis = RedisServer(VAR / "redis").start()
        started.append(redis)
        fleet = FleetPairs(VAR, stub, redis, 2, fleet_id="demo", extra_env={"GATEWAY_FLEET_HOST_TTL_SECONDS": "10"})
        fleet.control_token = _token()
        for gw in fleet.pairs:
            gw.control_token = fleet.control_token
            gw.env["GATEWAY_CONTROL_TOKEN"] = fleet.control_token
        started.append(fleet)
        fleet.start()
    except (AssertionError, RuntimeError, ServerExited) as exc:
        print(f"make fleet-demo: {exc}\nsee the logs under {VAR}", file=sys.stderr)
        _stop(started)
        return 1
    print(banner(fleet, redis), flush=True)
    stop = {"now": False}
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    procs = [p for gw in fleet.pairs for p in (gw.control, gw.dataplane) if p is not None]
    while not stop["now"] and all(p.alive for p in procs) and redis.alive:
        signal.sigtimedwait([signal.SIGCHLD], 0.5)
    _stop(started)
    print("\nstopped: both pairs, redis-server, the stub upstream")
    return 0


def _stop(started: list[object]) -> None:
    for thing in reversed(started):
        try:
            thing.stop()  # type: ignore[attr-defined]
        except Exception as exc:  # keep stopping the rest
            print(f"make fleet-demo: stopping {type(thing).__name__}: {exc}", file=sys.stderr)


def banner(fleet: FleetPairs, redis: RedisServer) -> str:
    a, b = fleet[0], fleet[1]
    auth = '-H "Authorization: Bearer $(cat var/fleet/control-token)"'
    mint = (
        f'-H \'Content-Type: application/json\' -d \'{{"dispatch_id":"d-1","repo_slug":"demo/repo",'
        f'"principal_kind":"worker","principal_id":"me","model":"{MODEL}"}}\''
    )
    return f"""
A Leasehold fleet is running on loopback (fleet id demo, stub upstream, logs under var/fleet/)
  redis     {redis.url}
  gw-a      control {a.control_url}   dataplane {a.dataplane_url}
  gw-b      control {b.control_url}   dataplane {b.dataplane_url}
  accounts  team-a (lease_capacity 2), team-b; both pairs share the token in var/fleet/control-token
  secret    var/fleet/fleet-secret (GATEWAY_FLEET_SECRET_FILE of both daemons of each pair: 32 random bytes,
            mode 0600, one per fleet)

1. The fleet as each host sees it:
  curl -s {a.control_url}/control/v2/fleet {auth}
  GATEWAY_CONTROL_URL={b.control_url} GATEWAY_CONTROL_TOKEN=$(cat var/fleet/control-token) .venv/bin/leaseholdctl fleet

2. Mint on gw-a, then twice on gw-b (change dispatch_id): the third lands on team-b, team-a is full fleet-wide:
  curl -s -X POST {a.control_url}/control/v2/mint {auth} {mint}

3. Disable team-a on gw-a; gw-b's next mint skips it:
  curl -s -X PATCH {a.control_url}/control/v2/accounts/team-a/state {auth} \\
    -H 'Content-Type: application/json' -d '{{"state":"disabled","reason":"demo"}}'

4. Counts fleet-wide, per host:
  curl -s {b.control_url}/control/v2/accounts {auth}

Ctrl-C stops everything.
"""


if __name__ == "__main__":
    sys.exit(main())
