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

import os
from collections.abc import Callable, Sequence

import msgspec
import redis.asyncio as aredis

from controlplane.decisions import Decision, LiveGroup, lease_decisions
from controlplane.fleet.signed import SignedDecisions
from controlplane.stores.journal import replay
from shared.codes import Condition, Outcome
from shared.fleet.entries import EntryKind, FleetEntries, Why
from shared.fleet.keys import Ceiling, FleetKeys
from shared.fleet.redis_client import guard
from shared.logging import get_logger
from shared.wire import Lease

log = get_logger("fleet")

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



class RedisDecisions:
    """The `DecisionStore` for a fleet."""

    def __init__(self, client: aredis.Redis, keys: FleetKeys, *, entries: FleetEntries,
                 ttl_s: float = DECISION_TTL_S, refused_ttl_s: float = REFUSED_TTL_S) -> None:
        self.client = client
        self.keys = keys
        self.entries = entries
        self._sign = SignedDecisions(keys, entries)   # SPEC §19
        self.ttl_ms = int(ttl_s * 1000)
        self.refused_ttl_ms = int(refused_ttl_s * 1000)
        self._add_evidence = client.register_script(ADD_EVIDENCE)
        self._claim_live = client.register_script(CLAIM_LIVE)
        self._end_key = client.register_script(END_KEY)
        self._reregister_live = client.register_script(REREGISTER_LIVE)

    async def record(self, decision: Decision) -> None:
        k = self.keys
        with guard("decision record"):
            if decision.key_id is None:
                await self.client.set(k.refused(decision.mint_decision_id),
                                      self._sign.tagged(decision.mint_decision_id, str(decision.outcome)),
                                      px=self.refused_ttl_ms)
                return
            if decision.skipped:  # answered and logged with the decision; not needed again
                decision = msgspec.structs.replace(decision, skipped=())
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.set(k.decision(decision.mint_decision_id), self._sign.signed(decision), px=self.ttl_ms)
                pipe.set(k.decision_of_key(decision.key_id), decision.mint_decision_id, px=self.ttl_ms)
                await pipe.execute()

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
        with guard("decision evidence"):
            await self._add_evidence(
                keys=[self.keys.decision(mint_decision_id), self.keys.evidence(mint_decision_id)],
                args=[self._sign.tagged(mint_decision_id, NO_CONDITION if condition is None else str(condition)),
                      EVIDENCE_CAP])

    async def evidence(self, mint_decision_id: str) -> tuple[Condition | None, ...]:
        with guard("decision evidence read"):
            items = await self.client.lrange(self.keys.evidence(mint_decision_id), 0, -1)
        where = self.keys.evidence(mint_decision_id)
        found: list[Condition | None] = []
        for item in items:
            value = self._sign.untagged(mint_decision_id, item, where)
            if value == NO_CONDITION:
                found.append(None)
            elif value in Condition._value2member_map_:
                found.append(Condition(value))
            elif value is not None:
                self.entries.reject(EntryKind.DECISION, where, Why.RANGE)
        return tuple(found)

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
                        args=[self.ttl_ms, k.cap(Ceiling.LEASE), host_id, *group.key_ids], client=pipe)
                answers = await pipe.execute()
        return sorted(key for group, answer in zip(groups, answers) if answer != 1 for key in group.key_ids)


LEASE_DECISIONS_FILE = "lease-decisions.jsonl"
# The journal gains a line per selected decision (a mint, a renewal, a hop) and is rewritten from
# memory once its lines reach this or twice the live decisions, whichever is more: at a mint a
# second, about once an hour, and never past max(4,096, 2 x live) lines of ~400 bytes.
COMPACT_MIN_LINES = 4_096

_encode_line = msgspec.json.Encoder().encode
_decode_line = msgspec.json.Decoder(Decision).decode


class LeaseDecisions:
    """The decisions of this host's live leases, kept by this host: what it re-registers when
    Redis lost them (SPEC §16), and what its own renew, extend and hops read first.

    One decision per live key: the one it was granted, then the one a hop re-bound it to. Added
    when a lease-bearing decision is recorded, forgotten when its key ends (not when a hop lets
    go of the key's lease: the key stays and is re-bound). Journalled, so it survives a control
    restart — also one while Redis lost its data: `$GATEWAY_STATE_DIR/lease-decisions.jsonl`,
    one decision a line (ids, lineage, position; nothing secret), appended at each add without
    an fsync (as the key table's journal), and rewritten from memory at `load` and whenever it
    has grown past `COMPACT_MIN_LINES` and twice the live decisions. At load the key table says
    which decision each live lease holds (`controlplane/decisions.lease_decisions`); a journal line
    for a key it does not know (a crash between a record and its grant) is dropped. Only the
    decisions: their evidence is Redis's alone. A journal that cannot be written is logged and
    memory goes on (Redis has the decision; only a data loss and a restart together would lose it).
    """

    def __init__(self, path: str | None, lease_of: Callable[[str], Lease | None]) -> None:
        self.path = path
        self.lease_of = lease_of
        self._by_key: dict[str, Decision] = {}
        self._by_id: dict[str, Decision] = {}
        self._fd: int | None = None
        self._lines = 0
        self._loaded = False         # nothing is rewritten before `load` read what is there

    def load(self, leases: Sequence[Lease]) -> list[str]:
        """Replay the journal, keep the decisions `leases` (the restored key table) hold, rewrite
        it compacted; answers the keys of the v2 leases whose decision the journal lacked."""
        known: dict[str, Decision] = {}
        if self.path is not None:
            for decision in replay(self.path, _decode_line, "lease_decision_line_skipped"):
                known[decision.mint_decision_id] = decision
        kept, missing = lease_decisions(leases, known)
        self._by_key = {}
        self._by_id = {}
        for decision in kept.values():
            self._remember(decision)
        self._loaded = True
        self._compact()
        return missing

    def add(self, decision: Decision) -> None:
        """A lease-bearing decision, recorded (a mint's, a renewal's or a hop's)."""
        assert decision.key_id is not None
        if self._loaded and (self._fd is None or self._lines >= max(COMPACT_MIN_LINES, 2 * len(self._by_key))):
            self._compact()   # before the new line: a crash before its grant finds the old one
        self._append(decision)
        self._remember(decision)

    def forget(self, key_id: str) -> None:
        """The key ended; while it is still live (a hop let go of its lease), its decision stays."""
        if self.lease_of(key_id) is None:
            decision = self._by_key.pop(key_id, None)
            if decision is not None:
                self._by_id.pop(decision.mint_decision_id, None)

    def of_key(self, key_id: str) -> Decision | None:
        return self._by_key.get(key_id)

    def get(self, mint_decision_id: str) -> Decision | None:
        return self._by_id.get(mint_decision_id)

    def by_id(self) -> dict[str, Decision]:
        return dict(self._by_id)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _remember(self, decision: Decision) -> None:
        assert decision.key_id is not None
        previous = self._by_key.get(decision.key_id)
        if previous is not None:
            self._by_id.pop(previous.mint_decision_id, None)
        self._by_key[decision.key_id] = decision
        self._by_id[decision.mint_decision_id] = decision

    def _append(self, decision: Decision) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, _encode_line(decision) + b"\n")
            self._lines += 1
        except OSError as exc:
            log.error("lease_decision_journal_write_failed", error=str(exc))

    def _compact(self) -> None:
        """Rewrite the journal from memory (a temporary file, fsynced, then renamed over it)."""
        if self.path is None:
            return
        self.close()
        tmp = self.path + ".tmp"
        try:
            with open(tmp, "wb") as handle:
                for decision in self._by_key.values():
                    handle.write(_encode_line(decision) + b"\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._lines = len(self._by_key)
        except OSError as exc:  # tried again at the next add
            log.error("lease_decision_journal_write_failed", error=str(exc))
