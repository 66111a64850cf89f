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
"""

from __future__ import annotations

import msgspec
import redis.asyncio as aredis

from controlplane.decisions import Decision
from shared.codes import Condition, Outcome
from shared.fleet.keys import FleetKeys
from shared.fleet.redis_client import guard

DECISION_TTL_S = 86_400 + 3_600   # the longest lease (86,400 s) and an hour to cite its end
REFUSED_TTL_S = 3_600             # a refused decision is cited only to be refused again
EVIDENCE_CAP = 1_024              # a fallback needs one qualifying terminal; keep the newest
NO_CONDITION = "-"                # a non-qualifying terminal in the evidence list

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

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Decision).decode


class RedisDecisions:
    """The `DecisionStore` for a fleet."""

    def __init__(self, client: aredis.Redis, keys: FleetKeys, *, ttl_s: float = DECISION_TTL_S,
                 refused_ttl_s: float = REFUSED_TTL_S) -> None:
        self.client = client
        self.keys = keys
        self.ttl_ms = int(ttl_s * 1000)
        self.refused_ttl_ms = int(refused_ttl_s * 1000)
        self._add_evidence = client.register_script(ADD_EVIDENCE)
        self._claim_live = client.register_script(CLAIM_LIVE)
        self._end_key = client.register_script(END_KEY)

    async def record(self, decision: Decision) -> None:
        k = self.keys
        with guard("decision record"):
            if decision.key_id is None:
                await self.client.set(k.refused(decision.mint_decision_id), str(decision.outcome),
                                      px=self.refused_ttl_ms)
                return
            if decision.skipped:  # answered and logged with the decision; not needed again
                decision = msgspec.structs.replace(decision, skipped=())
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.set(k.decision(decision.mint_decision_id), _encode(decision), px=self.ttl_ms)
                pipe.set(k.decision_of_key(decision.key_id), decision.mint_decision_id, px=self.ttl_ms)
                await pipe.execute()

    async def get(self, mint_decision_id: str) -> Decision | None:
        with guard("decision get"):
            raw = await self.client.get(self.keys.decision(mint_decision_id))
        return None if raw is None else _decode(raw)

    async def refused_outcome(self, mint_decision_id: str) -> Outcome | None:
        with guard("decision refused outcome"):
            raw = await self.client.get(self.keys.refused(mint_decision_id))
        return None if raw is None else Outcome(raw.decode())

    async def for_key(self, key_id: str) -> Decision | None:
        with guard("decision for key"):
            decision_id = await self.client.get(self.keys.decision_of_key(key_id))
            if decision_id is None:
                return None
            raw = await self.client.get(self.keys.decision(decision_id.decode()))
        return None if raw is None else _decode(raw)

    async def add_evidence(self, mint_decision_id: str, condition: Condition | None) -> None:
        with guard("decision evidence"):
            await self._add_evidence(
                keys=[self.keys.decision(mint_decision_id), self.keys.evidence(mint_decision_id)],
                args=[NO_CONDITION if condition is None else str(condition), EVIDENCE_CAP])

    async def evidence(self, mint_decision_id: str) -> tuple[Condition | None, ...]:
        with guard("decision evidence read"):
            items = await self.client.lrange(self.keys.evidence(mint_decision_id), 0, -1)
        return tuple(None if i == NO_CONDITION.encode() else Condition(i.decode()) for i in items)

    async def claim_live(self, key_id: str, repo_slug: str, dispatch_id: str, *,
                         allowing: str | None = None) -> bool:
        return await self._live(key_id, repo_slug, dispatch_id, allowing, check=True)

    async def note_live(self, key_id: str, repo_slug: str, dispatch_id: str) -> None:
        await self._live(key_id, repo_slug, dispatch_id, None, check=False)

    async def _live(self, key_id: str, repo_slug: str, dispatch_id: str, allowing: str | None,
                    *, check: bool) -> bool:
        with guard("decision live claim"):
            return await self._claim_live(
                keys=[self.keys.live(repo_slug, dispatch_id), self.keys.live_of_key(key_id)],
                args=[key_id, allowing or "", self.ttl_ms, "1" if check else "0"]) == 1

    async def end_key(self, key_id: str) -> None:
        with guard("decision end key"):
            await self._end_key(keys=[self.keys.live_of_key(key_id)], args=[key_id])

    async def live_keys(self, repo_slug: str, dispatch_id: str) -> set[str]:
        with guard("decision live keys"):
            members = await self.client.smembers(self.keys.live(repo_slug, dispatch_id))
        return {m.decode() for m in members}
