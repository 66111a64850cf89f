"""The fleet soak (`make soak-fleet`, the second half of `make soak`): three control + data plane
pairs sharing one real redis-server on loopback (SPEC §16), a seeded mix with faults injected on
a schedule, then the fleet's promises checked.

Usage: ``python -m bench.soak_fleet [--minutes 10] [--seconds S] [--seed N] [--workers 6]
[--summary PATH]``, or ``python -m bench.soak --fleet ...``. Prints each fault
as it ends, a JSON summary and one line per invariant; exit status 1 if any invariant fails.

Rule: every answer is classified as it arrives and the ledger row it implies is counted against
the host that served it (an answer other than 401 is one row; a gateway-authored refusal also
names its attempt id), so each host's ledger is checked exactly, as in `bench/soak.py`.

The mix, over the pairs `gw-a`, `gw-b`, `gw-c` (`tests/support/fleetpairs.py`, host TTL 4 s):
- v2 mints on all three hosts for `acme/capped` (policy: `team-a` only; `lease_capacity = 3`,
  `request_capacity = 4`) and `acme/open` (`team-a`, then the uncapped `team-b`), a third with
  the shortest TTL (60 s), some left to expire; renewals; revokes; requests on revoked keys
  (401) (`bench/soak_fleet_ops.py`, with the operator's admin and policy writes on any host);
- requests as `bench/soak.py` mixes them — JSON, streams, client aborts, scripted 429 / 500 and
  mid-stream resets through the stub's ``x-stub-step`` — with fewer qualifying failures (at
  soak.py's 18 % a fleet-wide circuit is open most of the time and most mints are held);
- faults, one at a time: Redis restarted empty, Redis paused past the reply timeout, one pair
  SIGKILLed mid-stream and started again with its host id once reaped, and the sampled ceilings
  (`bench/soak_fleet_faults.py`);
- throughout, a hostile writer without the fleet secret (SPEC §19): garbage in the fleet's
  streams, channels and hashes, and forged chain records with correct hashes, every few seconds
  (`bench/soak_fleet_hostile.py`); none may be believed, each kind is counted as rejected.
Each fault's window runs from its start until every host says `available` with three live, plus
`FAULT_GRACE_S`. Expected refusals are counted, never failures: inside a Redis window, mints,
renewals and writes held 503 `fleet-state-unavailable` and requests to `team-a` refused so; at
any time `team-a`'s ceilings (held `no-eligible-account`, 429 `request-capacity-exhausted`); a
401 on a lease a fault since its last answer may have ended (a host that returns ends those it
may no longer hold). The same answers outside every window are surprises. The end of the run and
its invariants: `bench/soak_fleet_checks.py`.

The promises this soak found broken, since fixed, are checked as invariants of their own
(`soak_fleet_checks.REGRESSIONS`).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aredis

from bench import soak
from bench import soak_fleet_checks as checks
from bench.soak_fleet_checks import REGRESSIONS
from bench.soak_fleet_faults import CAPPED, HOST_TTL_S, LEASE_CAP, OPEN, REDIS_FAULTS, REQUEST_CAP, FleetFaults, Window
from bench.soak_fleet_hostile import HostileWriter, hostile_results
from bench.soak_fleet_ops import CAPPED_REPO, POOL_TARGET, UNCAPPED_REPO, FleetOps, Lease
from shared.fleet.keys import FleetKeys
from tests.support.fleetpairs import MODEL, FleetPairs
from tests.support.harness import Gateway, Stub, credential_like
from tests.support.redis_server import RedisServer

HOSTS = 3
WEIGHTS = {"json": 45, "stream": 33, "abort": 8, "429": 2, "500": 2, "reset": 2, "revoked": 4}
MIX = {kind: (WEIGHTS[kind], *rest) for kind, (_, *rest) in soak.MIX.items()}


def accounts_toml(stub_url: str) -> str:
    def account(name: str, ceilings: str) -> str:
        env = f"GATEWAY_{name.upper().replace('-', '_')}_KEY"
        return (
            f'[[account]]\nid = "{name}"\nprovider_binding = "anthropic"\nbase_url = "{stub_url}"\n'
            f'auth_style = "x-api-key"\ncredential_env = "{env}"\nmodels = ["team-*"]\n{ceilings}\n'
        )

    return account(CAPPED, f"lease_capacity = {LEASE_CAP}\nrequest_capacity = {REQUEST_CAP}\n") + account(OPEN, "")


Row = tuple[str, str | None, str | None]  # (status, condition, refusal_reason) of a ledger row


@dataclass(eq=False)
class Host:
    index: int
    gw: Gateway
    up: bool = True
    draining: bool = False  # being taken down: nothing new is sent to it
    busy: int = 0  # requests and control calls of the soak in flight on it
    expected: collections.Counter[Row] = field(default_factory=collections.Counter)
    refusal_ids: list[str] = field(default_factory=list)
    lost: int = 0  # accepted attempts cut with its SIGKILLed data plane (no row owed)

    @property
    def name(self) -> str:
        return self.gw.env["GATEWAY_HOST_ID"]

    @property
    def usable(self) -> bool:
        return self.up and not self.draining


class FleetSoak(FleetOps, FleetFaults, HostileWriter):
    def __init__(
        self, fleet: FleetPairs, stub: Stub, redis: RedisServer, seed: int, workers: int, seconds: float
    ) -> None:
        self.fleet, self.stub, self.redis = fleet, stub, redis
        self.rng = random.Random(seed)
        self.workers, self.seconds = workers, seconds
        self.hosts = [Host(i, gw) for i, gw in enumerate(fleet.pairs)]
        self.keys = FleetKeys(fleet.fleet_id)
        self.auth = {"Authorization": f"Bearer {fleet.control_token}"}
        self.pool: list[Lease] = []  # in use
        self.expiring: list[Lease] = []  # left to expire by themselves
        self.revoked: list[tuple[int, str]] = []  # (host, token) of revoked keys
        self.revoke_later: list[Lease] = []  # a revoke the host could not answer
        self.windows: list[Window] = []
        self.faults: list[dict[str, Any]] = []
        self.grow = asyncio.Lock()  # held by whatever adds a lease to a key table
        self.refused_at: dict[str, float] = {}  # attempt id -> when the gateway refused it
        self.holder_seen: dict[str, float] = {}  # a suspect holder in Redis -> first seen
        self.leaked: set[str] = set()  # holders reported as leaked (below)
        self.unknown_leases: list[str] = []  # lease holders of keys no answer ever named
        self.minted_ids: set[str] = set()  # every key id a mint or renewal answered
        self.renewals_started = self.renewals_done = 0
        self.t0 = self.stop_at = 0.0
        self.session: aiohttp.ClientSession | None = None
        self.sampler_redis: Any = None
        self.n = 0
        self.tally: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.samples: dict[str, list[int]] = {}  # name -> [samples, max, over the ceiling renewing]
        self.violations: list[str] = []
        self.surprises: list[str] = []
        self.gaps: dict[str, list[str]] = {name: [] for name in REGRESSIONS}
        self.forged_hashes: set[str] = set()  # the hostile writer's chain records (SPEC §19)
        self.hostile_mirrored: list[str] = []  # any a host copied into its mirror
        self.hostile_rounds = 0

    # ---- bookkeeping ----------------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic()

    def at(self) -> float:
        return round(self.now() - self.t0, 1)

    def surprise(self, what: str) -> None:
        self.surprises.append(f"{self.at()} s: {what}")

    def in_redis_fault(self) -> bool:
        now = self.now()
        return any(w.kind in REDIS_FAULTS and w.overlaps(now, now) for w in self.windows)

    def lost_since(self, at: float) -> bool:
        """Whether Redis lost its data (a restart, empty) after monotonic time `at`."""
        return any(w.kind == "redis-restart" and w.start > at for w in self.windows)

    def lease_ended(self, lease: Lease, how: str) -> None:
        """The gateway says `lease` is gone (401, or a revoke that found nothing): fine if a
        fault that may end it (a Redis fault, or its own host's kill) met the time since it
        was last seen live."""
        if lease in self.pool:
            self.pool.remove(lease)
        lease.retired = True
        now = self.now()
        causes = [
            w.kind
            for w in self.windows
            if (w.host is None or w.host == lease.host) and w.overlaps(lease.last_live, now)
        ]
        if causes:
            self.tally["leases ended by a fault"][f"{causes[-1]} ({how})"] += 1
        else:
            self.surprise(
                f"{how} on {lease.key_id} ({lease.account_id} on {self.hosts[lease.host].name}), "
                f"live {now - lease.last_live:.1f} s before, outside every fault"
            )

    # ---- the data plane -------------------------------------------------------------------

    async def request(self, host: Host, token: str, kind: str, lease: Lease | None) -> None:
        _, step, stream, _ = MIX[kind]
        headers = {"x-api-key": token, "anthropic-version": "2023-06-01"}
        if step is not None:
            headers["x-stub-step"] = json.dumps(step)
        body = {"model": MODEL, "max_tokens": 16, "stream": stream, "messages": [{"role": "user", "content": "soak"}]}
        host.busy += 1
        if lease is not None:
            lease.in_use += 1
        self.tally["sent"][kind] += 1
        assert self.session is not None
        try:
            async with self.session.post(host.gw.dataplane_url + "/v1/messages", json=body, headers=headers) as r:
                await self.answer(host, kind, lease, r)
        except aiohttp.ClientPayloadError:
            if kind != "reset":
                self.surprise(f"{kind} on {host.name}: stream broken")
        except (TimeoutError, aiohttp.ClientConnectionError) as exc:
            if host.up:
                self.surprise(f"{kind} on {host.name}: {exc!r}")
        finally:
            host.busy -= 1
            if lease is not None:
                lease.in_use -= 1

    async def answer(self, host: Host, kind: str, lease: Lease | None, r: aiohttp.ClientResponse) -> None:
        """Classify one answer and count the row it implies on `host`."""
        if r.status == 401:
            await r.read()
            if lease is None:
                self.tally["answers"]["401 on a revoked key"] += 1
            else:
                self.lease_ended(lease, "401")
            return
        if lease is None:
            self.surprise(f"a revoked key answered {r.status} on {host.name}")
        if r.status >= 400 and r.content_type == "application/json":
            code = ((await r.json()).get("error") or {}).get("code")
            if code:  # gateway-authored: the upstream's error bodies carry no code
                self.gateway_refusal(host, lease, code, r.headers.get("request-id"))
                return
        if lease is not None:
            lease.last_live = self.now()
        want = {"429": 429, "500": 500}.get(kind, 200)
        if r.status != want:
            self.surprise(f"{kind} on {host.name}: HTTP {r.status}")
        host.expected[(*MIX[kind][3], None)] += 1
        self.tally["answers"][f"{kind} {r.status}"] += 1
        if kind == "abort":
            await r.content.readany()
            r.close()  # the worker gives up mid-stream
            return
        await r.read()
        if kind == "reset":
            self.surprise("reset: the cut stream ended cleanly")

    def gateway_refusal(self, host: Host, lease: Lease | None, code: str, attempt_id: str | None) -> None:
        host.expected[("refused", None, code)] += 1
        if attempt_id:
            host.refusal_ids.append(attempt_id)
            self.refused_at[attempt_id] = self.now()
        expected = code == "request-capacity-exhausted" or (code == "fleet-state-unavailable" and self.in_redis_fault())
        if lease is not None:
            lease.last_live = self.now()
            expected = expected and lease.account_id == CAPPED
        self.tally["request refusals"][code if expected else f"{code} (unexpected)"] += 1
        if not expected:
            self.surprise(f"request refused {code} on {host.name}")

    async def worker(self) -> None:
        kinds = list(MIX)
        weights = [MIX[k][0] for k in kinds]
        while self.now() < self.stop_at:
            kind = self.rng.choices(kinds, weights)[0]
            if kind == "revoked":
                choices = [(h, t) for h, t in self.revoked[-50:] if self.hosts[h].usable]
                if choices:
                    index, token = self.rng.choice(choices)
                    await self.request(self.hosts[index], token, kind, None)
                continue
            usable = [x for x in self.pool if self.hosts[x.host].usable and not x.retired]
            if not usable:
                await asyncio.sleep(0.05)  # pacing: no usable lease (a fault holds the mints)
                continue
            lease = self.rng.choice(usable)
            await self.request(self.hosts[lease.host], lease.token, kind, lease)

    # ---- the control plane ----------------------------------------------------------------

    async def api(
        self, host: Host, method: str, path: str, body: Any = None, *, counted: bool = True
    ) -> tuple[int, Any, dict[str, str]]:
        """One control call; (0, None, {}) when the host does not answer. `counted`: the call
        can change what the host holds (the host kill waits for those to end)."""
        assert self.session is not None
        if counted:
            host.busy += 1
        try:
            async with self.session.request(method, host.gw.control_url + path, json=body, headers=self.auth) as r:
                try:
                    payload = await r.json(content_type=None)
                except ValueError:
                    payload = None
                return r.status, payload, {k.lower(): v for k, v in r.headers.items()}
        except (TimeoutError, aiohttp.ClientError) as exc:
            if counted and host.up:
                self.surprise(f"{method} {path} on {host.name}: {exc!r}")
            return 0, None, {}
        finally:
            if counted:
                host.busy -= 1

    # ---- the run --------------------------------------------------------------------------

    async def run(self) -> list[tuple[str, bool, str]]:
        self.t0 = self.now()
        self.stop_at = self.t0 + self.seconds
        self.sampler_redis = aredis.Redis(
            host="127.0.0.1", port=self.redis.port, socket_timeout=0.3, socket_connect_timeout=0.3
        )
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
            self.session = session
            try:
                for repo, account in ((CAPPED_REPO, CAPPED), (UNCAPPED_REPO, OPEN)):
                    if not await self.write_policy(self.hosts[0], with_hop=False, repo=repo, account=account):
                        self.surprise(f"the first write of repo:{repo} was refused")
                for turn in range(POOL_TARGET):
                    await self.mint(self.hosts[turn % HOSTS])
                await asyncio.gather(
                    self.schedule(),
                    self.keeper(),
                    self.operator(),
                    self.sampler(),
                    self.hostile(),
                    *(self.worker() for _ in range(self.workers)),
                )
                return [*await checks.settle_and_check(self), *await hostile_results(self)]
            finally:
                await self.sampler_redis.aclose()


def start_fleet(workdir: Path, stub: Stub, redis: RedisServer) -> FleetPairs:
    fleet = FleetPairs(
        workdir / "fleet",
        stub,
        redis,
        HOSTS,
        accounts=accounts_toml(stub.url),
        extra_env={"GATEWAY_FLEET_HOST_TTL_SECONDS": str(HOST_TTL_S), "GATEWAY_CIRCUIT_COOLDOWN_SECONDS": "2"},
    )
    try:
        return fleet.start()
    except BaseException:
        fleet.stop()
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak_fleet", description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=None, help="overrides --minutes")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--summary", type=Path, default=None, help="also write the JSON summary here")
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else args.minutes * 60
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(f"soak-fleet: {seconds:.0f} s, seed {seed}, {args.workers} workers, {HOSTS} pairs", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="leasehold-soak-fleet-"))
    started = time.monotonic()
    stub = Stub(workdir / "stub", anthropic_key=credential_like("sk-ant-api03-"), openai_key=None)
    try:
        redis = RedisServer(workdir / "redis").start()
        try:
            fleet = start_fleet(workdir, stub, redis)
            try:
                run = FleetSoak(fleet, stub, redis, seed, args.workers, seconds)
                results = asyncio.run(run.run())
            finally:
                fleet.stop()
        finally:
            redis.stop()
    finally:
        stub.stop()
    summary = checks.summary(run, results, seed, time.monotonic() - started)
    print(json.dumps(summary, indent=2))
    if args.summary is not None:
        args.summary.write_text(json.dumps(summary, indent=2))
    return soak.verdict("soak-fleet", results, seed, workdir, width=55)


if __name__ == "__main__":
    sys.exit(main())
