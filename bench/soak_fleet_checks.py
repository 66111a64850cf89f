"""The end of the fleet soak (`bench/soak_fleet.py`): the fleet settles, then every invariant is
read back from the three hosts, their ledgers on disk and Redis, and the summary is built.

Settling, in order (each a condition with a deadline): every host `available` with three live;
the revokes a fault refused done again; the leases left to expire past their expiry; one request
on each lease still held (a 401 is a lease a fault ended, judged as during the run), so what the
soak holds is known exactly; nothing in flight on any host.

Invariants (each `(name, held, detail)`; exit status 1 if any fails):
- every fault recovered (every host `available`, three live) within its deadline;
- each ceiling sampled during the run never exceeded: Redis's lease and request holder
  registries of `team-a`, the sum of the three hosts' own key tables (`leasehold_leases`, read
  while no lease could be added anywhere), each host's accounts view — the lease ceiling plus
  one while a renewal's predecessor is still live (SPEC §5: the caller revokes it after the
  successor, which the gateway admits on the slot the predecessor is about to return);
- per host, ledger rows == attempts its data plane accepted, by (status, condition, refusal),
  except the attempts cut with a SIGKILLed data plane: no row is owed for those (the pair died
  before it could write one), and at most one (`dataplane-lost`) is allowed each;
- one row per attempt id across the fleet, and each gateway refusal's attempt id (its
  `request-id`) in the ledger of the host that answered it;
- nothing in flight (`/control/v2/routes/active` empty on every host);
- lease counts back to what the soak holds — per account and per host, in every host's accounts
  view, every host's key table and Redis's registries — and in-flight counts back to zero;
- every host's fleet view `available`, three hosts live, no write owed to Redis;
- both chains verified on every host, with the same revision and head hash everywhere, one
  record per write answered 200 (plus at most the writes held 503 whose answer was lost);
- the leases left to expire were ended by the gateway (their revoke finds nothing);
- every lease still held revokes, and the counts then read zero everywhere;
- no unexpected answer (a refusal or a 401 outside every fault window, a wrong status);
- no lease holder in Redis for a key no mint or renewal answered with (for `LEAK_GRACE_S`);
- each of `REGRESSIONS`, the promises this soak found broken, since fixed.
"""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING, Any

from bench.soak_fleet_faults import CAPPED, OPEN
from shared.fleet.keys import Ceiling
from tests.support.ledgerfiles import rows_on_disk
from tests.support.waits import until

if TYPE_CHECKING:
    from bench.soak_fleet import FleetSoak, Host

# What the fleet soak found broken, fixed since, each checked as an invariant of its own.
# name -> (the invariant, what broke it and where it was fixed)
REGRESSIONS = {
    "renewal-after-data-loss": (
        "a live lease minted before a Redis data loss renews",
        "SPEC §5, §16 (a data loss loses no promise): after Redis lost its data, a host re-registers "
        "its leases' holders and dispatch claims but not their decisions, so renewing a live lease "
        "minted before answered 404 decision-unknown (fixed: controlplane/fleet/decisions.LeaseDecisions, "
        "re-registered by FleetHost._reregister)",
    ),
    "request-holder-leak": (
        "no request holder outlives its refused attempt",
        "SPEC §6, §16 (release returns the slot): a request admission whose reply timed out while "
        "Redis hung is refused 503, but Redis runs the queued reserve when it resumes, and "
        "dataplane/admission.py FleetAdmission.reserve never recorded the holder, so nothing "
        "released it: team-a's request slot stayed taken (fixed: the holder goes to pending_release)",
    ),
}
Result = tuple[str, bool, str]
SETTLE_DEADLINE_S = 30.0
LOST_ROW = ("transport-error", None, "dataplane-lost")


async def waited(probe: Any, timeout_s: float, what: str) -> bool:
    try:
        await until(probe, timeout_s, what, interval_s=0.1)
        return True
    except AssertionError:
        return False


async def settle(soak: FleetSoak) -> None:
    await waited(soak.recovered, SETTLE_DEADLINE_S, "the fleet back")
    for lease in list(soak.revoke_later):
        soak.revoke_later.remove(lease)
        await soak.retire(lease)
    past = max((lease.expires_at for lease in soak.expiring), default=0.0) + 1.5  # + the reaper's second
    await waited(lambda: soak.now() > past, 15, "the leases left to expire to be past their expiry")
    for lease in list(soak.pool):
        await soak.request(soak.hosts[lease.host], lease.token, "json", lease)


async def settle_and_check(soak: FleetSoak) -> list[Result]:
    await settle(soak)
    results = [recovered(soak), *ceilings(soak)]
    idle = await waited(lambda: nothing_active(soak), SETTLE_DEADLINE_S, "nothing in flight")
    results.append(("nothing in flight on any host", idle, await active_detail(soak)))
    results.extend(ledgers(soak))
    held = collections.Counter((lease.host, lease.account_id) for lease in soak.pool)
    problems = await counts_settled(soak, held)
    per_account = dict(collections.Counter(a for _, a in held.elements()))
    results.append(
        (
            "lease and in-flight counts back to what is held",
            not problems,
            "; ".join(problems[:4]) or f"{sum(held.values())} leases held: {per_account}, 0 in flight",
        )
    )
    results.append(await fleet_views(soak))
    results.extend(await chains(soak))
    results.extend(await end_every_lease(soak))
    results.append(("no unexpected answer", not soak.surprises, "; ".join(soak.surprises[:5]) or "none"))
    results.append(
        (
            "no lease holder in Redis without a lease",
            not soak.unknown_leases,
            "; ".join(soak.unknown_leases[:3]) or "none seen",
        )
    )
    for name, (title, why) in REGRESSIONS.items():
        seen = soak.gaps[name]
        results.append((title, not seen, f"{len(seen)} times ({'; '.join(seen[:3])}): {why}" if seen else "never hit"))
    return results


def recovered(soak: FleetSoak) -> Result:
    kinds = collections.Counter(f["kind"] for f in soak.faults)
    failed = [f for f in soak.faults if not f.get("recovered")]
    return (
        "every fault recovered",
        not failed,
        "; ".join(f"{f['kind']} at {f['at_s']} s: {f.get('error')}" for f in failed) or f"{dict(kinds)}",
    )


def ceilings(soak: FleetSoak) -> list[Result]:
    out = []
    for name, (n, most, renewing) in sorted(soak.samples.items()):
        mine = [v for v in soak.violations if name in v]
        during = f" ({renewing} one over, each while a renewal's predecessor was live)" if renewing else ""
        out.append((f"never exceeded: {name}", not mine, "; ".join(mine[:3]) or f"{n} samples, max {most}{during}"))
    if not soak.samples:
        out.append(("ceilings sampled", False, "no sample taken"))
    return out


async def nothing_active(soak: FleetSoak) -> bool:
    counts = await asyncio.gather(*(active_count(soak, h) for h in soak.hosts))
    return all(c == 0 for c in counts)


async def active_count(soak: FleetSoak, host: Host) -> int | None:
    status, body, _ = await soak.api(host, "GET", "/control/v2/routes/active", counted=False)
    return body.get("count") if status == 200 else None


async def active_detail(soak: FleetSoak) -> str:
    counts = await asyncio.gather(*(active_count(soak, h) for h in soak.hosts))
    return ", ".join(f"{h.name}: {c}" for h, c in zip(soak.hosts, counts)) + " active routes"


def ledgers(soak: FleetSoak) -> list[Result]:
    exact, by_kind, ids, refusals = [], [], [], []
    for host in soak.hosts:
        rows = rows_on_disk(host.gw.state_dir)
        got = collections.Counter((r["status"], r["condition"], r["refusal_reason"]) for r in rows)
        lost_rows = got.pop(LOST_ROW, 0)
        want = sum(host.expected.values())
        exact.append(
            (
                len(rows) - lost_rows == want and lost_rows <= host.lost,
                f"{host.name} {len(rows)} rows of {want} attempts"
                + (f" (+{host.lost} cut by its SIGKILL, {lost_rows} of them with a row)" if host.lost else ""),
            )
        )
        diff = {
            f"{s}/{c}/{r}": (got[k], n)
            for k in set(got) | set(host.expected)
            for (s, c, r), n in [(k, host.expected[k])]
            if got[k] != n
        }
        by_kind.append(
            (
                not diff,
                f"{host.name}: "
                + (
                    ", ".join(f"{k} {g} of {n}" for k, (g, n) in sorted(diff.items()))
                    or f"{len(host.expected)} kinds as answered"
                ),
            )
        )
        mine = {r["attempt_id"] for r in rows}
        ids.extend(r["attempt_id"] for r in rows)
        missing = [a for a in host.refusal_ids if a not in mine]
        refusals.append(
            (not missing, f"{host.name}: {len(host.refusal_ids) - len(missing)} of {len(host.refusal_ids)}")
        )
    dupes = len(ids) - len(set(ids))
    return [
        ("ledger rows == attempts accepted, per host", all(ok for ok, _ in exact), "; ".join(d for _, d in exact)),
        (
            "rows by status/condition/refusal as answered",
            all(ok for ok, _ in by_kind),
            "; ".join(d for _, d in by_kind),
        ),
        ("one row per attempt id across the fleet", dupes == 0, f"{len(ids)} rows, {dupes} duplicates"),
        (
            "each refusal's row on the host that answered it",
            all(ok for ok, _ in refusals),
            "; ".join(d for _, d in refusals),
        ),
    ]


async def counts_settled(soak: FleetSoak, held: collections.Counter[tuple[int, str]]) -> list[str]:
    """Waits (with a deadline) for every count to match `held`; what still differs after it."""

    async def matched() -> bool:
        return not await count_problems(soak, held)

    await waited(matched, 20, "the counts to match what is held")
    return await count_problems(soak, held)


async def count_problems(soak: FleetSoak, held: collections.Counter[tuple[int, str]]) -> list[str]:
    """Every view of the lease and in-flight counts against what the soak holds (`held`:
    (host, account) -> leases): what differs."""
    problems: list[str] = []
    per_account = collections.Counter[str]()
    for (_, account), n in held.items():
        per_account[account] += n
    for host in soak.hosts:
        status, view, _ = await soak.api(host, "GET", "/control/v2/accounts", counted=False)
        if status != 200:
            problems.append(f"{host.name}: accounts view {status}")
            continue
        for row in view["accounts"]:
            by_host = {x["host_id"]: x["lease_count"] for x in row.get("hosts", []) if x["lease_count"]}
            want = {soak.hosts[h].name: n for (h, a), n in held.items() if a == row["id"] and n}
            if row["lease_count"] != per_account[row["id"]] or by_host != want or row["in_flight_count"]:
                problems.append(
                    f"{host.name} sees {row['id']}: {row['lease_count']} leases {by_host}, "
                    f"{row['in_flight_count']} in flight; held {per_account[row['id']]} {want}"
                )
        table = {a: n for a, n in (await soak.key_table(host)).items() if n}
        want_table = {a: n for (h, a), n in held.items() if h == host.index and n}
        if table != want_table:
            problems.append(f"{host.name}'s key table {table}, held {want_table}")
    for account in {a for _, a in held} | {CAPPED, OPEN}:
        lease_holders = [
            h.decode() for h in await soak.sampler_redis.hkeys(soak.keys.cap_account(Ceiling.LEASE, account))
        ]
        soak.note_unknown_leases(lease_holders)  # reported by their own invariant
        leases = len([h for h in lease_holders if h not in soak.leaked])
        holders = [h.decode() for h in await soak.sampler_redis.hkeys(soak.keys.cap_account(Ceiling.REQUEST, account))]
        soak.note_leaks(holders)  # reported by their own invariant
        requests = [h for h in holders if h not in soak.leaked]
        if leases != per_account[account] or requests:
            problems.append(
                f"Redis: {account} {leases} lease holders (held {per_account[account]}), "
                f"{len(requests)} request holders"
            )
    return problems


async def fleet_views(soak: FleetSoak) -> Result:
    async def settled() -> bool:
        views = await asyncio.gather(*(soak.fleet_view(h) for h in soak.hosts))
        return all(
            v.get("state") == "available"
            and v.get("hosts_live") == len(soak.hosts)
            and sum(x["live"] for x in v.get("hosts", [])) == len(soak.hosts)
            and v.get("writes_owed") == 0
            for v in views
        )

    ok = await waited(settled, 20, "every fleet view settled")
    views = await asyncio.gather(*(soak.fleet_view(h) for h in soak.hosts))
    detail = ", ".join(
        f"{h.name}: {v.get('state')} {v.get('hosts_live')} live, {v.get('writes_owed')} owed"
        for h, v in zip(soak.hosts, views)
    )
    return ("every host's fleet view available, 3 hosts live", ok, detail)


async def chains(soak: FleetSoak) -> list[Result]:
    out = []
    for name, _view_path, audit_path, what in (
        ("admin", "/control/v2/accounts/admin", "/control/v2/accounts/audit", "admin writes"),
        ("policy", "/control/v2/policy", "/control/v2/policy/audit", "policy writes"),
    ):
        seen = []
        for host in soak.hosts:
            _, audit, _ = await soak.api(host, "GET", audit_path, counted=False)
            records = (audit or {}).get("records") or []
            seen.append(
                (
                    (audit or {}).get("chain_verdict"),
                    (audit or {}).get("revision"),
                    records[-1]["hash"] if records else None,
                )
            )
        ok_writes = soak.tally[what]["200"]
        held = soak.tally[what]["503 fleet-state-unavailable"]
        verdicts = {v for v, _, _ in seen}
        revision = seen[0][1] or 0
        same = len(set(seen)) == 1
        held_ok = verdicts == {"verified"} and same and ok_writes <= revision <= ok_writes + held
        out.append(
            (
                f"{name} chain verified, the same on every host",
                held_ok,
                f"{verdicts}, revision {sorted({r for _, r, _ in seen}, key=str)} on {len(seen)} hosts, "
                f"{ok_writes} writes answered 200, {held} held",
            )
        )
    return out


async def end_every_lease(soak: FleetSoak) -> list[Result]:
    expired_live = []
    for lease in soak.expiring:
        status, body, _ = await soak.api(soak.hosts[lease.host], "DELETE", f"/control/v1/keys/{lease.key_id}")
        if status != 200 or body.get("revoked") is not False:
            expired_live.append(f"{lease.key_id}: {status} {body}")
    for lease in list(soak.pool):
        await soak.retire(lease)
    problems = await counts_settled(soak, collections.Counter())
    return [
        (
            "leases left to expire were ended by the gateway",
            not expired_live,
            "; ".join(expired_live[:3]) or f"{len(soak.expiring)} expired",
        ),
        (
            "every lease revoked at the end, counts back to zero",
            not problems and not soak.revoke_later,
            "; ".join(problems[:4]) or f"{soak.tally['revokes']['revoked']} revokes in all",
        ),
    ]


def summary(soak: FleetSoak, results: list[Result], seed: int, wall_s: float) -> dict[str, Any]:
    return {
        "seed": seed,
        "seconds": soak.seconds,
        "wall_s": round(wall_s, 1),
        "workers": soak.workers,
        "hosts": [h.name for h in soak.hosts],
        "faults": {"counts": dict(collections.Counter(f["kind"] for f in soak.faults)), "runs": soak.faults},
        "tally": {what: dict(sorted(counter.items())) for what, counter in sorted(soak.tally.items())},
        "rows": {
            h.name: {
                "expected": sum(h.expected.values()),
                "lost_mid_stream": h.lost,
                "on_disk": len(rows_on_disk(h.gw.state_dir)),
            }
            for h in soak.hosts
        },
        "samples": {
            name: {"samples": n, "max": most, "over_the_ceiling_while_renewing": renewing}
            for name, (n, most, renewing) in sorted(soak.samples.items())
        },
        "invariants": [{"name": n, "held": ok, "detail": d} for n, ok, d in results],
        "ok": all(ok for _, ok, _ in results),
    }
