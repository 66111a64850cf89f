"""The fleet soak's faults and its sampled invariants (mixed into `bench/soak_fleet.FleetSoak`).

Faults run one at a time, in `FAULTS` order, with `gap_s` of plain load between them; a fault is
only started if it fits in the run (`FAULT_COST_S`). Each one opens a `Window` (what its answers
may licence) and closes it once every host says `available` with three hosts live:
- `redis-restart`: redis-server stopped (every host sees `unavailable`), started again empty on
  its port: the data-loss path (re-registration, chains re-seeded from the mirrors, the hold
  until every host registered);
- `redis-pause`: SIGSTOP for `PAUSE_S` (past the reply timeout, under the host TTL), SIGCONT;
- `host-kill`: nothing new is sent to the host, the stub holds up to `KILL_STREAMS` of its
  streams mid-answer (on `team-b` leases, minted for `acme/uncapped` if need be: no request
  ceiling refuses them), the soak waits until nothing else of its own is in flight there and the
  host's ledger holds every attempt that finished, then SIGKILLs the data plane and the
  control daemon, waits until the others reaped it (its slots back), lets them take `team-a`'s
  free slots, and starts it again with the same host id (its key journal's leases come back;
  those that no longer fit end, and their worker gets 401).

The sampler, every `SAMPLE_PACE_S`: Redis's lease and request registries of `team-a` against
their ceilings; the three hosts' own key tables (`leasehold_leases`), summed, against the lease
ceiling — read under `grow`, the lock everything that adds a lease to a table holds (mints,
renewals, a killed host's start), so each table only shrinks while it is read and the sum bounds
the true fleet-wide count from above; one host's accounts view in turn; and every request holder
in Redis against the refusals the soak saw (a refused attempt holds no slot).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
import redis.asyncio as aredis

from shared.fleet.keys import Ceiling
from tests.support.fleetpairs import MODEL
from tests.support.harness import Gateway
from tests.support.ledgerfiles import rows_on_disk
from tests.support.waits import until

if TYPE_CHECKING:
    from bench.soak_fleet import FleetSoak, Host
    from bench.soak_fleet_ops import Lease

CAPPED, OPEN = "team-a", "team-b"
LEASE_CAP, REQUEST_CAP = 3, 4
HOST_TTL_S = 4  # a beat every 4/3 s: a killed host is reaped within ~5.3 s
PAUSE_S = 2.0  # twice the 1 s reply timeout (shared/fleet/redis_client.TIMEOUT_S), under the TTL
KILL_STREAMS = 2
SAMPLE_PACE_S = 0.3
LEAK_GRACE_S = 2.5  # a release retried by the data plane's upkeep (1 s) is done by then
FAULTS = ("redis-restart", "host-kill", "redis-pause")
FAULT_COST_S = {"redis-restart": 3.0, "host-kill": HOST_TTL_S + 5.0, "redis-pause": PAUSE_S + 3.0}
RECOVERY_DEADLINE_S = 30.0
FAULT_GRACE_S = 3.0  # after a fault's recovery is seen, answers it caused may still arrive
REDIS_FAULTS = ("redis-restart", "redis-pause")
LEASES_GAUGE = re.compile(r'^leasehold_leases\{account_id="([^"]+)"\} ([0-9.e+]+)$', re.M)


@dataclass
class Window:
    """A fault's time, monotonic: from its start until the fleet was seen recovered."""

    kind: str
    host: int | None  # the killed host; None: a Redis fault, every host
    start: float
    end: float | None = None

    def overlaps(self, since: float, now: float) -> bool:
        """Whether [since, now] meets the window (stretched by `FAULT_GRACE_S` past its end)."""
        return self.start <= now and (self.end is None or self.end + FAULT_GRACE_S >= since)


class FleetFaults:
    """The fault schedule and the sampler; `self` is the `FleetSoak`."""

    # ---- what the hosts say ---------------------------------------------------------------

    async def fleet_view(self: FleetSoak, host: Host) -> dict[str, Any]:
        status, view, _ = await self.api(host, "GET", "/control/v2/fleet", counted=False)
        return view if status == 200 and isinstance(view, dict) else {}

    async def recovered(self: FleetSoak) -> bool:
        views = await asyncio.gather(*(self.fleet_view(h) for h in self.hosts))
        return all(v.get("state") == "available" and v.get("hosts_live") == len(self.hosts) for v in views)

    async def all_unavailable(self: FleetSoak) -> bool:
        views = await asyncio.gather(*(self.fleet_view(h) for h in self.hosts))
        return all(v.get("state") == "unavailable" for v in views)

    async def key_table(self: FleetSoak, host: Host) -> dict[str, int]:
        """`leasehold_leases` by account on `host` (its own key table); {} when it does not
        answer (a killed host serves nothing)."""
        if not host.up:
            return {}
        assert self.session is not None
        try:
            async with self.session.get(host.gw.control_url + "/metrics", headers=self.auth) as r:
                if r.status != 200:
                    return {}
                text = await r.text()
        except (TimeoutError, aiohttp.ClientError):
            return {}
        return {account: int(float(n)) for account, n in LEASES_GAUGE.findall(text)}

    # ---- the schedule ---------------------------------------------------------------------

    async def schedule(self: FleetSoak) -> None:
        gap_s = max(1.5, min(15.0, self.seconds / 12))
        next_at = self.now() + gap_s
        for turn in itertools.count():
            kind = FAULTS[turn % len(FAULTS)]
            if next_at + FAULT_COST_S[kind] > self.stop_at:
                return
            await asyncio.sleep(max(0.0, next_at - self.now()))  # pacing: plain load between faults
            await self.fault(kind)
            next_at = self.now() + gap_s

    async def fault(self: FleetSoak, kind: str) -> None:
        record: dict[str, Any] = {"kind": kind, "at_s": self.at()}
        started = self.now()
        try:
            await {"redis-restart": self.redis_restart, "redis-pause": self.redis_pause, "host-kill": self.host_kill}[
                kind
            ](record)
            await until(self.recovered, RECOVERY_DEADLINE_S, "every host available with 3 live", interval_s=0.1)
            record["recovered"] = True
        except AssertionError as exc:
            record["recovered"] = False
            record["error"] = str(exc)
        finally:
            self.windows[-1].end = self.now()
            record["duration_s"] = round(self.now() - started, 2)
            self.faults.append(record)
        print(f"soak-fleet: {json.dumps(record)}", flush=True)

    async def redis_restart(self: FleetSoak, record: dict[str, Any]) -> None:
        self.windows.append(Window("redis-restart", None, self.now()))
        await asyncio.to_thread(self.redis.stop)
        await until(self.all_unavailable, 10, "every host to say unavailable", interval_s=0.05)
        record["down_s"] = round(self.now() - self.windows[-1].start, 2)
        await asyncio.to_thread(self.redis.restart)  # same port, nothing kept

    async def redis_pause(self: FleetSoak, record: dict[str, Any]) -> None:
        self.windows.append(Window("redis-pause", None, self.now()))
        self.redis.pause()
        try:
            seen = await asyncio.gather(*(self.fleet_view(h) for h in self.hosts))
            record["hosts_saying_unavailable"] = sum(v.get("state") == "unavailable" for v in seen)
            await asyncio.sleep(max(0.0, self.windows[-1].start + PAUSE_S - self.now()))  # pacing: hung
        finally:
            self.redis.resume()
        record["paused_s"] = round(self.now() - self.windows[-1].start, 2)

    async def host_kill(self: FleetSoak, record: dict[str, Any]) -> None:
        usable = [h for h in self.hosts if h.usable]
        holding = [h for h in usable if any(x.host == h.index and x.account_id == CAPPED for x in self.pool)]
        target = self.rng.choice(holding or usable)  # one with team-a leases, for its return to end
        record["host"] = target.name
        # team-b's fleet-wide circuit may be open: every qualifying terminal of its older leases
        # moves the reopen time later (SPEC §7), so a mint may wait for a quiet moment
        await until(lambda: self.has_lease_on(target), 60, f"a team-b lease on {target.name}", interval_s=0.2)
        target.draining = True
        self.windows.append(Window("host-kill", target.index, self.now()))
        names: list[str] = []
        try:
            killed = await self.kill_mid_stream(target, names, record)
            await until(lambda: self.reaped(target), 3 * HOST_TTL_S + 5, f"{target.name} reaped", interval_s=0.05)
            record["slots_back_s"] = round(self.now() - killed, 2)
            record["team_a_taken_meanwhile"] = await self.fill_capped()
        finally:
            for name in names:
                await asyncio.to_thread(self.stub.release, name)
            if not target.up:
                async with self.grow:  # its journal's leases come back: nothing else may grow meanwhile
                    await asyncio.to_thread(target.gw.start)
                    target.up = True
                record["down_s"] = round(self.now() - self.windows[-1].start, 2)
            target.draining = False

    def streamable(self: FleetSoak, target: Host) -> list[Lease]:
        """`target`'s `team-b` leases: no request ceiling, so a stream on one is never refused."""
        return [x for x in self.pool if x.host == target.index and x.account_id == OPEN]

    async def has_lease_on(self: FleetSoak, target: Host) -> bool:
        if not self.streamable(target):
            await self.mint(target, repo="acme/uncapped")  # something to stream on
        return bool(self.streamable(target))

    async def fill_capped(self: FleetSoak) -> int:
        """While a host is away, the others take whatever `team-a` slots it held: its return
        must then end those of its leases that no longer fit (401)."""
        taken = 0
        for turn in range(LEASE_CAP):
            others = [h for h in self.hosts if h.usable]
            lease = await self.mint(others[turn % len(others)], repo="acme/capped")
            taken += lease is not None
        return taken

    async def kill_mid_stream(self: FleetSoak, target: Host, names: list[str], record: dict[str, Any]) -> float:
        """SIGKILL `target`'s pair while the stub holds its kill streams mid-answer, once nothing
        else of the soak is in flight there and its ledger holds every attempt that finished;
        answers when it was killed."""
        mine = self.streamable(target)
        started: list[bool] = []
        names.extend(f"kill-{len(self.faults)}-{i}" for i in range(min(KILL_STREAMS, len(mine))))
        streams = [
            asyncio.create_task(self.kill_stream(target, lease, name, started)) for lease, name in zip(mine, names)
        ]
        try:
            await until(lambda: len(started) == len(streams), 15, "the kill streams mid-answer", interval_s=0.01)
            await until(lambda: target.busy == sum(started), 30, f"{target.name}'s other calls to end", interval_s=0.01)
            await until(
                lambda: len(rows_on_disk(target.gw.state_dir)) >= sum(target.expected.values()),
                15,
                f"{target.name}'s ledger to hold every finished attempt",
                interval_s=0.05,
            )
        finally:
            killed = self.now()
            target.up = False  # from now on a call that finds it gone is no surprise
            await asyncio.to_thread(self.sigkill, target.gw)
            record["streams_cut"] = sum(started)
            await asyncio.gather(*streams)
        return killed

    @staticmethod
    def sigkill(gw: Gateway) -> None:
        for proc in (gw.dataplane, gw.control):  # the data plane first, as a host losing power would
            assert proc is not None
            proc.stop(signal.SIGKILL)

    async def reaped(self: FleetSoak, target: Host) -> bool:
        """The other hosts see two live and nothing held by `target`; Redis holds nothing of it."""
        views = await asyncio.gather(*(self.fleet_view(h) for h in self.hosts if h is not target))
        gone = all(
            v.get("hosts_live") == len(self.hosts) - 1
            and target.name not in [x["host_id"] for x in v.get("hosts", []) if x["live"] or x["lease_count"]]
            for v in views
        )
        return gone and not await self.sampler_redis.exists(
            self.keys.cap_host(Ceiling.LEASE, target.name), self.keys.cap_host(Ceiling.REQUEST, target.name)
        )

    async def kill_stream(self: FleetSoak, host: Host, lease: Lease, hold: str, started: list[bool]) -> None:
        """A stream the stub holds after two events, on the host about to be killed: accepted,
        then cut by the SIGKILL before its data plane could report it (`host.lost`)."""
        headers = {
            "x-api-key": lease.token,
            "x-stub-step": json.dumps({"deltas": 20, "hold_after_events": 2, "hold": hold}),
        }
        body = {"model": MODEL, "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": "kill"}]}
        assert self.session is not None
        host.busy += 1
        lease.in_use += 1
        cut = False
        try:
            async with self.session.post(host.gw.dataplane_url + "/v1/messages", json=body, headers=headers) as r:
                if r.status != 200:
                    started.append(False)
                    await self.answer(host, "stream", lease, r)
                    return
                await r.content.readany()
                started.append(True)
                cut = True
                host.lost += 1
                await r.read()
                self.surprise(f"a kill stream on {host.name} ended cleanly")
        except (TimeoutError, aiohttp.ClientError):
            if not cut:
                self.surprise(f"a kill stream on {host.name} failed before it started")
                started.append(False)
        finally:
            host.busy -= 1
            lease.in_use -= 1

    # ---- the sampler ----------------------------------------------------------------------

    def sample(self: FleetSoak, name: str, value: int, limit: int, detail: str = "", *, ceiling: int = 0) -> None:
        """One sample of `name` against `limit`; `ceiling` (when the limit may exceed it, during a
        renewal) counts the samples above the ceiling itself."""
        seen = self.samples.setdefault(name, [0, 0, 0])
        seen[0] += 1
        seen[1] = max(seen[1], value)
        seen[2] += bool(ceiling) and value > ceiling
        if value > limit:
            self.violations.append(f"{self.at()} s: {name} {value} > {limit} {detail}".rstrip())

    def lease_limit(self: FleetSoak, done_before: int) -> int:
        """The lease ceiling for a read that began when `renewals_done` was `done_before` and
        just ended: one more if a renewal overlapped it (renewals run one at a time)."""
        return LEASE_CAP + (1 if self.renewals_started > done_before else 0)

    async def sampler(self: FleetSoak) -> None:
        turn = 0
        while self.now() < self.stop_at:
            await asyncio.sleep(SAMPLE_PACE_S)
            turn += 1
            try:
                await self.sample_redis()
            except (aredis.RedisError, OSError):
                pass  # Redis away: a fault is on
            async with self.grow:
                done = self.renewals_done
                tables = await asyncio.gather(*(self.key_table(h) for h in self.hosts))
                self.sample(
                    "leases of team-a in the hosts' key tables",
                    sum(t.get(CAPPED, 0) for t in tables),
                    self.lease_limit(done),
                    str([t.get(CAPPED, 0) for t in tables]),
                    ceiling=LEASE_CAP,
                )
            host = self.hosts[turn % len(self.hosts)]
            if host.up:
                done = self.renewals_done
                status, view, _ = await self.api(host, "GET", "/control/v2/accounts", counted=False)
                if status == 200:
                    row = next(a for a in view["accounts"] if a["id"] == CAPPED)
                    self.sample(
                        "team-a lease_count in an accounts view",
                        row["lease_count"],
                        self.lease_limit(done),
                        host.name,
                        ceiling=LEASE_CAP,
                    )

    async def sample_redis(self: FleetSoak) -> None:
        registry = self.sampler_redis
        done = self.renewals_done
        leases = await registry.hgetall(self.keys.cap_account(Ceiling.LEASE, CAPPED))
        self.sample(
            "redis lease holders of team-a",
            len(leases),
            self.lease_limit(done),
            str(sorted(k.decode() for k in leases)),
            ceiling=LEASE_CAP,
        )
        holders = await registry.hkeys(self.keys.cap_account(Ceiling.REQUEST, CAPPED))
        self.sample("redis request holders of team-a", len(holders), REQUEST_CAP)
        self.note_leaks([h.decode() for h in holders])
        others = await registry.hkeys(self.keys.cap_account(Ceiling.LEASE, OPEN))
        self.note_unknown_leases([k.decode() for k in leases] + [k.decode() for k in others])

    def note_unknown_leases(self: FleetSoak, holders: list[str]) -> list[str]:
        """Lease holders in Redis no mint or renewal ever answered with, seen for `LEAK_GRACE_S`
        or longer (a mint's own holder is unknown only until its answer): slots taken for good."""
        now = self.now()
        leaked = []
        for holder in (h for h in holders if h not in self.minted_ids):
            first = self.holder_seen.setdefault(holder, now)
            if now - first >= LEAK_GRACE_S:
                leaked.append(holder)
                if holder not in self.leaked:
                    self.leaked.add(holder)
                    self.unknown_leases.append(f"{self.at()} s: {holder} held since {now - first:.1f} s")
        return leaked

    def note_leaks(self: FleetSoak, holders: list[str]) -> list[str]:
        """Request holders in Redis whose attempt the gateway refused (a refused attempt holds
        no slot), seen for `LEAK_GRACE_S` or longer: each is a slot taken for good. Answers them."""
        now = self.now()
        leaked = []
        for holder in (h for h in holders if h in self.refused_at):
            first = self.holder_seen.setdefault(holder, now)
            if now - first >= LEAK_GRACE_S:
                leaked.append(holder)
                if holder not in self.leaked:
                    self.leaked.add(holder)
                    self.gaps["request-holder-leak"].append(
                        f"{self.at()} s: {holder} held since {now - first:.1f} s, refused "
                        f"{now - self.refused_at[holder]:.1f} s before"
                    )
        return leaked
