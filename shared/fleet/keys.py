"""The Redis key layout of one fleet: every key name is built here, nowhere else.

Every key starts with the fleet's hash tag `{<fleet_id>}:`, so several fleets share one Redis
without meeting, and all of one fleet's keys hash to one cluster slot. The layout targets one
Redis server (with replicas or Sentinel for failover); the scripts that derive a key from a
stored value (a holder's account, a dead host's holders) stay within the fleet's slot, which is
what would let the layout run on a cluster unchanged.

| key | type | holds |
|---|---|---|
| `{f}:incarnation` | string | a random id written by the first host to claim; it changes (or vanishes) only when Redis lost its data |
| `{f}:hosts:seen` | zset | host id → last heartbeat (ms, Redis's clock) |
| `{f}:hosts:beat` | hash | host id → `<ms>:<mac>`: its last heartbeat's time, sealed with the fleet secret (SPEC §19) |
| `{f}:hosts:instance` | hash | host id → the id of the process holding it (a random instance id) |
| `{f}:hosts:epoch` | hash | host id → times it was declared dead (bumped by the reaper) |
| `{f}:registered` | set | hosts that registered their holders in this incarnation of the data (lost with it) |
| `{f}:hosts:flight:<host>` | hash | account → attempts in flight on that host (written with its heartbeat, with a TTL) |
| `{f}:cap:<table>:owner` | hash | holder → account (`table` is `lease` or `request`) |
| `{f}:cap:<table>:acct:<account>` | hash | holder → host: the account's registry (HLEN is its count) |
| `{f}:cap:<table>:host:<host>` | hash | holder → account: what a host holds (for the reaper) |
| `{f}:cap:<table>:hosts` | set | hosts holding anything in the table |
| `{f}:circuit:<account>` | string | the account's `Circuit`, msgpack (absent = closed) |
| `{f}:dec:d:<decision>` | string | a lease-bearing decision, msgpack, with a TTL |
| `{f}:dec:r:<decision>` | string | a refused decision's outcome, with a TTL |
| `{f}:dec:k:<key>` | string | key id → decision id, with a TTL |
| `{f}:dec:e:<decision>` | list | the decision's terminal conditions (`-` for none), with a TTL |
| `{f}:live:d:<n>:<repo><dispatch>` | set | a dispatch's live key ids (`n` = the repo slug's length), with a TTL |
| `{f}:live:k:<key>` | string | key id → its dispatch's live-set key, with a TTL |
| `{f}:chain:<name>:records` / `:anchor` / `:rev` / `:lock` / `:seeded` | strings | a chain's records, anchor, revision counter, writer lock, re-seed marker |
| `{f}:spend:host:<host>` | hash | window key → that host's spend cells in the window, msgpack; `_` marks it whole |
| `{f}:spend:versions` | hash | host → the version of its last spend publish |
| `{f}:spend:moved` | channel | a host published its spend (the message is its host id) |
| `{f}:headroom` | hash | `<account>/<kind>` → `<observed_at_ms>:<entry>`: the newest rate-limit observation (SPEC §22) |
| `{f}:events` | channel | account.state, circuit and policy events |
| `{f}:revoke` | stream | account-wide revoke-leases requests |
| `{f}:revoke:acks:<request>` | hash | host → leases it ended, for each host that acknowledged one request, with a TTL |
| `{f}:revoke:acked` | channel | wakes a requester when an acknowledgement arrives |
"""

from __future__ import annotations

import re
from enum import StrEnum

FLEET_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


class Ceiling(StrEnum):
    """The two capacity tables (SPEC §6): leases at the mint, requests at the proxy."""

    LEASE = "lease"
    REQUEST = "request"


class FleetKeys:
    def __init__(self, fleet_id: str) -> None:
        if not FLEET_ID_RE.match(fleet_id):
            raise ValueError(f"fleet id {fleet_id!r} is outside {FLEET_ID_RE.pattern}")
        self.fleet_id = fleet_id
        self.prefix = "{" + fleet_id + "}:"
        p = self.prefix
        self.incarnation = p + "incarnation"
        self.hosts_seen = p + "hosts:seen"
        self.hosts_instance = p + "hosts:instance"
        self.hosts_beat = p + "hosts:beat"
        self.hosts_epoch = p + "hosts:epoch"
        self.registered = p + "registered"
        self.events = p + "events"
        self.revoke = p + "revoke"
        self.revoke_acked = p + "revoke:acked"
        self.spend_versions = p + "spend:versions"
        self.spend_moved = p + "spend:moved"
        self.headroom = p + "headroom"

    # ---- capacity ---------------------------------------------------------------------------

    def cap(self, table: Ceiling) -> str:
        """The prefix of one capacity table's keys (scripts derive per-account/host keys from it)."""
        return f"{self.prefix}cap:{table}:"

    def cap_owner(self, table: Ceiling) -> str:
        return self.cap(table) + "owner"

    def cap_account(self, table: Ceiling, account_id: str) -> str:
        return self.cap(table) + "acct:" + account_id

    def cap_host(self, table: Ceiling, host_id: str) -> str:
        return self.cap(table) + "host:" + host_id

    def cap_hosts(self, table: Ceiling) -> str:
        return self.cap(table) + "hosts"

    # ---- circuits and decisions ---------------------------------------------------------------

    def circuit(self, account_id: str) -> str:
        return self.prefix + "circuit:" + account_id

    def decision(self, mint_decision_id: str) -> str:
        return self.prefix + "dec:d:" + mint_decision_id

    def refused(self, mint_decision_id: str) -> str:
        return self.prefix + "dec:r:" + mint_decision_id

    def decision_of_key(self, key_id: str) -> str:
        return self.prefix + "dec:k:" + key_id

    def evidence(self, mint_decision_id: str) -> str:
        return self.prefix + "dec:e:" + mint_decision_id

    def live(self, repo_slug: str, dispatch_id: str) -> str:
        """A dispatch's live set. The repo slug's length makes the pair unambiguous whatever
        characters either holds (`a:b` + `c` and `a` + `b:c` are different keys)."""
        return f"{self.prefix}live:d:{len(repo_slug)}:{repo_slug}{dispatch_id}"

    def live_of_key(self, key_id: str) -> str:
        return self.prefix + "live:k:" + key_id

    # ---- chains and fan-out -------------------------------------------------------------------

    def chain(self, name: str, part: str) -> str:
        if part not in ("records", "anchor", "rev", "lock", "seeded"):
            raise ValueError(part)
        return f"{self.prefix}chain:{name}:{part}"

    def host_in_flight(self, host_id: str) -> str:
        return self.prefix + "hosts:flight:" + host_id

    def host_sockets(self, host_id: str) -> str:
        return self.prefix + "hosts:sockets:" + host_id

    def revoke_acks(self, request_id: str) -> str:
        return self.prefix + "revoke:acks:" + request_id

    # ---- spend --------------------------------------------------------------------------------

    def spend_host(self, host_id: str) -> str:
        return self.prefix + "spend:host:" + host_id
