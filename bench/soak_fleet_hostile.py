"""The fleet soak's hostile writer (SPEC §19; mixed into `bench/soak_fleet.FleetSoak`).

Throughout the run, every `HOSTILE_PACE_S`, a Redis client that does not hold the fleet secret
writes what the hosts read and must not believe:
- the revoke stream: an entry without `from_host` (it once crash-looped control), one that is
  not UTF-8, and a well-formed request for `team-a` with a made-up MAC;
- the channels: non-JSON and a forged `account.state` event on the events channel, garbage on
  the spend and acknowledgement channels;
- the hashes: a host id's spend with a negative cost (and its version moved, so it is read), a
  window of a real host's spend replaced by garbage under a key no real publish writes, and
  garbage in-flight counts for a live host;
- every `CHAIN_EVERY` rounds, a forged admin record with a correct hash (`team-a` enabled by
  "alice"), appended by compare-and-set and removed again once every host read the chain
  `corrupt` (or `FORGE_HOLD_S` passed); no host may copy it into its mirror.

The invariants it adds: no host mirrored a forged record; the chains held `corrupt` while forged;
and `leasehold_fleet_entries_rejected_total` counted each kind it was sent (`revoke`, `event`,
`spend`) on some host, and something on every host the soak did not kill (a killed host
counts from its restart on, maybe after the last round). `decision` and `revoke-ack` entries are only read when cited or while a revoke
waits: `tests/integration/test_fleet_hostile_entries.py` covers them. The soak's other
invariants (ceilings, ledgers, chains verified and the same on every host at the end, no
unexpected answer) must hold as before.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import TYPE_CHECKING

import msgspec

from shared.chain import encode_anchor, encode_record, seal

if TYPE_CHECKING:
    from bench.soak_fleet import FleetSoak

HOSTILE_PACE_S = 3.0
CHAIN_EVERY = 4  # a forged chain record every fourth round
FORGE_HOLD_S = 3.0  # the longest a forged record stays (every host reads it corrupt first)
KINDS = ("revoke", "event", "spend")
REJECTED = re.compile(r'^leasehold_fleet_entries_rejected_total\{kind="([^"]+)"\} ([0-9.e+]+)$', re.M)

# KEYS: records, anchor, rev; ARGV: the records' expected bytes, the forged line, its anchor.
FORGE = """
local now = redis.call('GET', KEYS[1]) or ''
if now ~= ARGV[1] then return 0 end
redis.call('APPEND', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[3])
redis.call('INCR', KEYS[3])
return 1
"""
# KEYS: records, anchor, rev; ARGV: the forged bytes, the bytes before, the anchor before ('' none).
UNFORGE = """
if (redis.call('GET', KEYS[1]) or '') ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
if ARGV[3] == '' then redis.call('DEL', KEYS[2]) else redis.call('SET', KEYS[2], ARGV[3]) end
redis.call('INCR', KEYS[3])
return 1
"""


class HostileWriter:
    """`self` is the `FleetSoak` (its `hostile_*` fields are set in its constructor)."""

    async def hostile(self: FleetSoak) -> None:
        turn = 0
        while self.now() + HOSTILE_PACE_S + FORGE_HOLD_S < self.stop_at:
            await asyncio.sleep(HOSTILE_PACE_S)  # pacing: a writer's round every few seconds
            if self.in_redis_fault():
                continue
            turn += 1
            try:
                await self.garbage()
                if turn % CHAIN_EVERY == 0:
                    await self.forge_chain()
            except Exception as exc:  # Redis away (a fault began): the next round writes again
                self.tally["hostile writer"][f"round failed: {type(exc).__name__}"] += 1

    async def garbage(self: FleetSoak) -> None:
        r, k = self.sampler_redis, self.keys
        await r.xadd(k.revoke, {"request_id": "x", "account_id": "y"})
        await r.xadd(k.revoke, {"request_id": b"\xff\xfe", "account_id": "team-a", "from_host": "gw-a", "mac": "m"})
        await r.xadd(
            k.revoke, {"request_id": "rv-" + "0" * 16, "account_id": "team-a", "from_host": "gw-a", "mac": "A" * 43}
        )
        forged_event = {
            "kind": "account.state",
            "host_id": "gw-a",
            "data": {"account_id": "team-a", "state": "enabled"},
            "mac": "A" * 43,
        }
        for message in (b"not json", json.dumps(forged_event).encode(), b"\xc1"):
            await r.publish(k.events, message)
        await r.publish(k.spend_moved, b"\xff")
        await r.publish(k.revoke_acked, b"rv-garbage")
        negative = msgspec.msgpack.encode([("platform", "", [-999.99, 1, 0, 0, 0, 0, 0])])
        await r.hset(k.spend_host("gw-evil"), mapping={"2026-12": negative, "_": "1"})
        await r.hset(k.spend_host(self.hosts[0].name), "1999-01", msgspec.msgpack.encode(("A" * 43, negative)))
        self.hostile_rounds += 1
        version = f"evil:{self.hostile_rounds}"
        await r.hset(k.spend_versions, mapping={"gw-evil": version, self.hosts[0].name: version})
        await r.publish(k.spend_moved, b"gw-evil")
        await r.hset(k.host_in_flight(self.hosts[1].name), mapping={"team-a": "-5", "team-b": "many"})
        self.tally["hostile writer"]["garbage rounds"] += 1

    async def forge_chain(self: FleetSoak) -> None:
        r, k = self.sampler_redis, self.keys
        records_key, anchor_key, rev_key = (k.chain("account-admin", p) for p in ("records", "anchor", "rev"))
        before = await r.get(records_key) or b""
        anchor_before = await r.get(anchor_key)
        lines = before.splitlines()
        last = json.loads(lines[-1]) if lines else {}
        fields = {key: value for key, value in last.items() if key not in ("seq", "prev_hash", "hash", "mac")}
        fields.update(
            {
                "account_id": "team-a",
                "action": "set-state",
                "state": "enabled",
                "actor": "alice",
                "actor_authenticated_by": "control-token",
                "reason": "hostile writer",
            }
        )
        record = seal(fields, len(lines) + 1, last.get("hash", "0" * 64))
        line = encode_record(record)
        if not await r.eval(
            FORGE, 3, records_key, anchor_key, rev_key, before, line, encode_anchor(len(lines) + 1, record["hash"])
        ):
            self.tally["hostile writer"]["forge skipped (a write moved the chain)"] += 1
            return
        self.forged_hashes.add(record["hash"])
        try:
            corrupt = await self.wait_all_corrupt(FORGE_HOLD_S)
            self.tally["hostile writer"][
                "forged records, every host corrupt" if corrupt else "forged records, not every host looked in time"
            ] += 1
        finally:
            undone = await r.eval(
                UNFORGE, 3, records_key, anchor_key, rev_key, before + line, before, anchor_before or b""
            )
            if not undone:
                self.surprise("the forged admin record could not be removed (the chain moved under it)")
        for host in self.hosts:
            mirror = host.gw.state_dir / "account-admin.jsonl"
            if mirror.exists() and record["hash"].encode() in mirror.read_bytes():
                self.hostile_mirrored.append(f"{host.name} mirrored forged record {record['hash'][:12]}")

    async def wait_all_corrupt(self: FleetSoak, timeout_s: float) -> bool:
        deadline = self.now() + timeout_s
        while self.now() < deadline:
            views = await asyncio.gather(
                *(self.api(h, "GET", "/control/v2/accounts/audit", counted=False) for h in self.hosts if h.usable)
            )
            if all((v or {}).get("chain_verdict") == "corrupt" for _, v, _ in views):
                return True
            await asyncio.sleep(0.1)  # pacing: the hosts' chain poll is 0.5 s
        return False

    async def rejected_by_host(self: FleetSoak) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        assert self.session is not None
        for host in self.hosts:
            async with self.session.get(host.gw.control_url + "/metrics", headers=self.auth) as response:
                text = await response.text()
            out[host.name] = {kind: float(n) for kind, n in REJECTED.findall(text)}
        return out


async def hostile_results(soak: FleetSoak) -> list[tuple[str, bool, str]]:
    counts = await soak.rejected_by_host()
    # a host killed and started again (the host-kill fault) counts from its restart on: each kind
    # must show on some host, and every host must have rejected something
    missing = [kind for kind in KINDS if not any(kinds.get(kind) for kinds in counts.values())]
    killed = {f.get("host") for f in soak.faults if f["kind"] == "host-kill"}
    missing += [f"{host}: nothing" for host, kinds in counts.items() if not any(kinds.values()) and host not in killed]
    rounds = soak.tally["hostile writer"]["garbage rounds"]
    forged = sum(n for what, n in soak.tally["hostile writer"].items() if what.startswith("forged records"))
    shown = "; ".join(
        f"{h}: {', '.join(f'{k} {int(v)}' for k, v in sorted(c.items()) if v)}" for h, c in counts.items()
    )
    return [
        (
            "hostile writer: no forged record mirrored",
            not soak.hostile_mirrored,
            "; ".join(soak.hostile_mirrored[:3]) or f"{forged} forged records, none mirrored",
        ),
        (
            "hostile writer: every kind rejected and counted on every host",
            rounds > 0 and not missing,
            f"{rounds} rounds; " + ("missing " + ", ".join(missing[:6]) if missing else shown),
        ),
    ]
