"""Seeded random interleavings across three control daemons of one fleet (SPEC §16): mints,
revokes, expiries, a host killed and restarted from its key journal, and Redis losing every key
— and after each step, no account's ceiling is exceeded: neither in Redis's registry nor by the
leases the running hosts would serve. At the end, once the fleet has settled, every lease a
host serves holds its slot (nothing lost).

In one process over a real redis-server (`tests/support/fleethosts.py`: the daemon's own wiring;
expiry is `reap_expired` at a later `now`, which the daemons' reaper calls every second). The
seed is printed; `FLEET_SEED=<n>` replays a run.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from shared.capacity import StateUnavailable
from shared.clock import now_ms
from tests.support.fleethosts import FleetHosts, accounts, mint
from tests.support.redis_server import RedisServer
from tests.support.waits import until

CEILINGS = {"acct-a": 2, "acct-c": 3, "acct-b": None}
STEPS = 70


async def _served(fleet: FleetHosts) -> dict[str, int]:
    counts: dict[str, int] = {}
    for control in fleet.hosts.values():
        for account, n in control.service.keys.count_by_account().items():
            counts[account] = counts.get(account, 0) + n
    return counts


async def _check(fleet: FleetHosts, step: str) -> None:
    served = await _served(fleet)
    any_host = next(iter(fleet.hosts.values()))
    for account, ceiling in CEILINGS.items():
        if ceiling is None:
            continue
        assert served.get(account, 0) <= ceiling, (step, account, served)
        try:
            held = await any_host.service.lease_capacity.count(account)
        except StateUnavailable:
            continue
        assert held <= ceiling, (step, account, held)


async def test_random_interleavings_never_exceed_a_ceiling(tmp_path: Path) -> None:
    seed = int(os.environ.get("FLEET_SEED", random.randrange(1 << 30)))
    print(f"FLEET_SEED={seed}")
    rng = random.Random(seed)
    server = RedisServer(tmp_path / "redis").start()
    fleet = FleetHosts(tmp_path, server.url, "r", accounts(CEILINGS))
    names = ["h1", "h2", "h3"]
    down: str | None = None
    crash_at, flush_at = rng.randrange(10, STEPS // 2), rng.randrange(STEPS // 2, STEPS - 10)
    try:
        for name in names:
            await fleet.add(name)
        for n in range(STEPS):
            step = f"{n}"
            if n == crash_at:
                down = rng.choice(names)
                await fleet.crash(down)
                step += f" crash {down}"
            elif down is not None and n == crash_at + 8:
                await fleet.add(down)  # its journal's leases re-registered, the ceiling honoured
                step += f" restart {down}"
                down = None
            elif n == flush_at:
                fleet.hosts[next(iter(fleet.hosts))].fleet.b.sync.flushall()
                step += " flushall"
            else:
                host = fleet.hosts[rng.choice(sorted(fleet.hosts))]
                live = host.service.keys.all()
                op = rng.random()
                if op < 0.55 or not live:
                    answer = await mint(host, f"d{n}", ttl_seconds=rng.choice((60, 600)))
                    step += f" mint {answer.status} {answer.body.get('account_id')}"
                elif op < 0.85:
                    await host.service.revoke(rng.choice(live).key_id)
                    step += " revoke"
                else:
                    await host.service.reap_expired(now_ms() + 61_000)
                    step += " expire"
            await _check(fleet, step)

        async def settled() -> bool:  # every served lease holds its slot, once the fleet recovered
            for control in fleet.hosts.values():
                for lease in control.service.keys.all():
                    if not await control.service.lease_capacity.holds(lease.key_id):
                        return False
            return True

        await until(settled, 20, "every served lease to hold its slot")
        await _check(fleet, "end")
    finally:
        await fleet.stop_all()
        server.stop()
