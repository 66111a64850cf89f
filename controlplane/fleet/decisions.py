"""`RedisDecisions`: the v2 decision table for a fleet (SPEC §5, §16), bounded by lifetime.

Rule: every key this table writes carries a TTL, so the table is bounded by time instead of
the in-process count cap: a decision, its key index and its evidence live `ttl_s` (a day by
default: past the longest lease, 86,400 s, a citation has nothing left to cite); a refused
decision's outcome lives `refused_ttl_s`. A citation of an expired decision is
`fallback-lineage-unknown`, held: the safe way, as with an evicted one. Evidence is a list per
decision, appended only while the decision is kept, and keeps the newest `EVIDENCE_CAP`.

`claim_live` is one Lua script, so one live lease per dispatch holds across the fleet; the
live sets carry the same TTL (refreshed by each claim), so a lease whose end was never told
(its host died) stops holding the dispatch at the latest a day later (the reaper's
`Reaped` lease holders are ended through `end_key` well before that).

Losing Redis's data must not lose a live lease's decision (SPEC §16). A host is the only writer
of its own leases' decisions (renew, extend, a hop and the release seam run where the key
lives) and a decision never changes once recorded, so each host keeps those of its live leases
itself (`LeaseDecisions`, journalled beside the key table) and re-registers them — with the
dispatches' live sets, `reregister_live` — before it admits new holders, at start and after a
data loss (`controlplane/fleet/host.py`). What comes back is each decision whole: lineage,
position, hop, key, policy revision, citation, driver. What does not is its evidence: the list
of a decision's terminal conditions is Redis's alone, so after a data loss it holds only the
terminals that arrived since; a retry citing a decision whose qualifying terminal was lost is
held `fallback-not-authorised`, and a supersede of one whose terminals were lost is not rejected
`fallback-response-was-not-lost` (it takes the same position, spending no hop). The decisions
of leases already ended, and held and rejected ones (their outcome only), are not kept either:
a citation of one after a data loss is `fallback-lineage-unknown`, held.

Nothing read here is believed unless a host of the fleet wrote it (SPEC §19): a decision is
stored as `[mac, decision]` (the MAC over its id and its bytes), each evidence item and a
refused outcome as `<value>:<mac>`; one that does not verify or decode is skipped, logged once
and counted (`decision`): a decision read as absent (a citation of it is held
`fallback-lineage-unknown`), an evidence item as never recorded (a retry is held
`fallback-not-authorised`). A forged decision or terminal can therefore not authorise a fallback.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Sequence
from typing import Any

import msgspec
import redis.asyncio as aredis

from controlplane.decisions import Decision, LiveGroup
from controlplane.fleet.signed import SignedDecisions
from shared.codes import Condition, Outcome
from shared.fleet.entries import EntryKind, FleetEntries, Why
from shared.fleet.keys import Ceiling, FleetKeys
from shared.fleet.redis_client import guard
from shared.fleet.soon import soon, soon_script
from shared.logging import get_logger

log = get_logger("fleet")

DECISION_TTL_S = 86_400 + 3_600  # the longest lease (86,400 s) and an hour to cite its end
REFUSED_TTL_S = 3_600  # a refused decision is cited only to be refused again
EVIDENCE_CAP = 1_024  # a fallback needs one qualifying terminal; keep the newest
NO_CONDITION = "-"  # a non-qualifying terminal in the evidence list

# KEYS: decision, evidence; ARGV: condition, cap. Appends only to a kept decision; the list
# lives exactly as long as its decision.
ADD_EVIDENCE = """
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -2 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[2]), -1)
if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
return 1
"""

# KEYS: live set, key -> live set; ARGV: key, allowing ('' none), ttl ms, '1' to check.
CLAIM_LIVE = """
if ARGV[4] == '1' then
  for _, live in ipairs(redis.call('SMEMBERS', KEYS[1])) do
    if live ~= ARGV[1] and live ~= ARGV[2] then return 0 end
  end
end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SET', KEYS[2], KEYS[1], 'PX', ARGV[3])
return 1
"""

# KEYS: key -> live set; ARGV: key
END_KEY = """
local live = redis.call('GET', KEYS[1])
if live then
  redis.call('SREM', live, ARGV[1])
  redis.call('DEL', KEYS[1])
end
return 1
"""

# KEYS: the dispatch's live set, then key -> live set of each of ARGV[4..]; ARGV: ttl ms, the
# lease table's key prefix, this host, this host's live keys of the dispatch. 1 registered, 0
# refused: another host holds a live lease of the dispatch (a lease slot tagged with that host),
# so these keys must end. A member holding no slot, or one of this host's, is a lease that ended
# (its end still owed, or lost with the data) and is dropped.
REREGISTER_LIVE = """
local mine = {}
for i = 4, #ARGV do mine[ARGV[i]] = true end
for _, live in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if not mine[live] then
    local account = redis.call('HGET', ARGV[2] .. 'owner', live)
    local host = account and redis.call('HGET', ARGV[2] .. 'acct:' .. account, live)
    if host and host ~= ARGV[3] then return 0 end
    redis.call('SREM', KEYS[1], live)
  end
end
for i = 4, #ARGV do
  redis.call('SADD', KEYS[1], ARGV[i])
  redis.call('SET', KEYS[i - 2], KEYS[1], 'PX', ARGV[1])
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"""

# KEYS: decision, key -> decision id; ARGV: the signed decision, its id, ttl ms. Both or neither
# (one script, not MULTI: it rides in the batch of the mint's other commands, `BatchingRedis`).
RECORD = """
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return 1
"""


class RedisDecisions:
    """The `DecisionStore` for a fleet."""

    def __init__(
        self,
        client: aredis.Redis,
        keys: FleetKeys,
        *,
        entries: FleetEntries,
        ttl_s: float = DECISION_TTL_S,
        refused_ttl_s: float = REFUSED_TTL_S,
    ) -> None:
        self.client = client
        self.keys = keys
        self.entries = entries
        self._sign = SignedDecisions(keys, entries)  # SPEC §19
        self.ttl_ms = int(ttl_s * 1000)
        self.refused_ttl_ms = int(refused_ttl_s * 1000)
        self._add_evidence = client.register_script(ADD_EVIDENCE)
        self._claim_live = client.register_script(CLAIM_LIVE)
        self._end_key = client.register_script(END_KEY)
        self._reregister_live = client.register_script(REREGISTER_LIVE)
        self._record = client.register_script(RECORD)

    async def record(self, decision: Decision, *, staged: bool = False) -> None:
        if staged:  # written by `stage`, in the claims' exchange
            return
        if decision.key_id is None:
            with guard("decision record"):
                await self.client.set(
                    self.keys.refused(decision.mint_decision_id),
                    self._sign.tagged(decision.mint_decision_id, str(decision.outcome)),
                    px=self.refused_ttl_ms,
                )
            return
        await self.stage(decision)

    def stage(self, decision: Decision) -> Awaitable[None]:
        """A lease-bearing decision, written whole (both keys, one script) ahead of its claims,
        so it rides in their exchange (`BatchingRedis`; issue 27): a mint's record costs no
        round trip of its own. Nobody can cite it before the mint answers (its id and key are
        new), and a refused or failed claim deletes it (`unstage`) before that answer."""
        k = self.keys
        assert decision.key_id is not None
        key_id = decision.key_id
        if decision.skipped:  # answered and logged with the decision; not needed again
            decision = msgspec.structs.replace(decision, skipped=())
        return soon_script(
            self._record,
            "decision record",
            _nothing,
            [k.decision(decision.mint_decision_id), k.decision_of_key(key_id)],
            [self._sign.signed(decision), decision.mint_decision_id, self.ttl_ms],
        )

    async def unstage(self, decision: Decision, *, failed: bool = False) -> None:
        """A staged decision whose claim was refused or failed: its keys (and any evidence)
        deleted, in one command."""
        assert decision.key_id is not None
        k = self.keys
        with guard("decision unstage"):
            await self.client.delete(
                k.decision(decision.mint_decision_id),
                k.decision_of_key(decision.key_id),
                k.evidence(decision.mint_decision_id),
            )

    async def get(self, mint_decision_id: str) -> Decision | None:
        with guard("decision get"):
            raw = await self.client.get(self.keys.decision(mint_decision_id))
        return self._sign.decision_of(mint_decision_id, raw)

    async def refused_outcome(self, mint_decision_id: str) -> Outcome | None:
        with guard("decision refused outcome"):
            raw = await self.client.get(self.keys.refused(mint_decision_id))
        where = self.keys.refused(mint_decision_id)
        value = None if raw is None else self._sign.untagged(mint_decision_id, raw, where)
        if value is None or value not in Outcome._value2member_map_:
            if value is not None:
                self.entries.reject(EntryKind.DECISION, where, Why.RANGE)
            return None
        return Outcome(value)

    async def for_key(self, key_id: str) -> Decision | None:
        with guard("decision for key"):
            decision_id = await self.client.get(self.keys.decision_of_key(key_id))
            if decision_id is None:
                return None
            decision_id_text = decision_id.decode("utf-8", "replace")
            raw = await self.client.get(self.keys.decision(decision_id_text))
        decision = self._sign.decision_of(decision_id_text, raw)
        return decision if decision is None or decision.key_id == key_id else None

    async def add_evidence(self, mint_decision_id: str, condition: Condition | None) -> None:
        await self.append_evidence(mint_decision_id, condition)

    async def append_evidence(self, mint_decision_id: str, condition: Condition | None) -> bool:
        """`add_evidence`, answering whether it was appended (False: the decision is not kept)."""
        with guard("decision evidence"):
            appended = await self._add_evidence(
                keys=[self.keys.decision(mint_decision_id), self.keys.evidence(mint_decision_id)],
                args=[
                    self._sign.tagged(mint_decision_id, NO_CONDITION if condition is None else str(condition)),
                    EVIDENCE_CAP,
                ],
            )
        return bool(appended == 1)

    async def evidence(self, mint_decision_id: str) -> tuple[Condition | None, ...]:
        with guard("decision evidence read"):
            items = await self.client.lrange(self.keys.evidence(mint_decision_id), 0, -1)
        where = self.keys.evidence(mint_decision_id)
        found: list[Condition | None] = []
        for item in items:
            value = self._sign.untagged(mint_decision_id, item, where)
            if value == NO_CONDITION:
                found.append(None)
            elif value is not None and value in Condition._value2member_map_:
                found.append(Condition(value))
            elif value is not None:
                self.entries.reject(EntryKind.DECISION, where, Why.RANGE)
        return tuple(found)

    def claim_live(
        self, key_id: str, repo_slug: str, dispatch_id: str, *, allowing: str | None = None
    ) -> Awaitable[bool]:
        return self._live(key_id, repo_slug, dispatch_id, allowing, check=True)

    async def note_live(self, key_id: str, repo_slug: str, dispatch_id: str) -> None:
        await self._live(key_id, repo_slug, dispatch_id, None, check=False)

    def _live(
        self, key_id: str, repo_slug: str, dispatch_id: str, allowing: str | None, *, check: bool
    ) -> Awaitable[bool]:
        return soon_script(
            self._claim_live,
            "decision live claim",
            _is_one,
            [self.keys.live(repo_slug, dispatch_id), self.keys.live_of_key(key_id)],
            [key_id, allowing or "", self.ttl_ms, "1" if check else "0"],
        )

    def end_key(self, key_id: str) -> Awaitable[None]:
        return soon_script(self._end_key, "decision end key", _nothing, [self.keys.live_of_key(key_id)], [key_id])

    def live_keys(self, repo_slug: str, dispatch_id: str) -> Awaitable[set[str]]:
        return soon(self.client, "decision live keys", _decoded, "SMEMBERS", self.keys.live(repo_slug, dispatch_id))

    # ---- re-registration (SPEC §16: Redis lost its data, or this host restarted) -------------

    async def reregister(self, decisions: Sequence[Decision]) -> None:
        """Record a host's live leases' decisions again, each with its key index (one pipeline;
        the same bytes when Redis kept them, with their lifetime renewed)."""
        if not decisions:
            return
        k = self.keys
        with guard("decision reregister"):
            async with self.client.pipeline(transaction=False) as pipe:
                for decision in decisions:
                    assert decision.key_id is not None
                    pipe.set(k.decision(decision.mint_decision_id), self._sign.signed(decision), px=self.ttl_ms)
                    pipe.set(k.decision_of_key(decision.key_id), decision.mint_decision_id, px=self.ttl_ms)
                await pipe.execute()

    async def stored(self, mint_decision_ids: Sequence[str]) -> dict[str, Decision]:
        """The decisions Redis holds of these ids (one MGET), by id."""
        if not mint_decision_ids:
            return {}
        with guard("decision stored"):
            raws = await self.client.mget([self.keys.decision(i) for i in mint_decision_ids])
        found = {i: self._sign.decision_of(i, raw) for i, raw in zip(mint_decision_ids, raws)}
        return {i: decision for i, decision in found.items() if decision is not None}

    async def reregister_live(self, groups: Sequence[LiveGroup], host_id: str) -> list[str]:
        """Put a host's live keys back into their dispatches' live sets, each dispatch atomically,
        unless another host holds a live lease of it now (it minted one while these keys' entries
        were lost, or after this host was declared dead): answers those refused keys, which must
        end — one live lease per dispatch holds, the host coming back yields."""
        if not groups:
            return []
        k = self.keys
        with guard("decision live reregister"):
            async with self.client.pipeline(transaction=False) as pipe:
                for group in groups:
                    await self._reregister_live(
                        keys=[k.live(group.repo_slug, group.dispatch_id), *map(k.live_of_key, group.key_ids)],
                        args=[self.ttl_ms, k.cap(Ceiling.LEASE), host_id, *group.key_ids],
                        client=pipe,
                    )
                answers = await pipe.execute()
        return sorted(key for group, answer in zip(groups, answers) if answer != 1 for key in group.key_ids)


# The journal lives in a Redis-free module, so embedded mode uses it without the Redis client.
from controlplane.stores.leasedecisions import LEASE_DECISIONS_FILE, LeaseDecisions  # noqa: E402,F401


def _is_one(reply: object) -> bool:
    return reply == 1


def _nothing(_reply: object) -> None:
    return None


def _decoded(members: Iterable[Any]) -> set[str]:
    """A set's members (a list under RESP2, a set under RESP3) as text."""
    return {m.decode() for m in members}
