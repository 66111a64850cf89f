"""Nothing secret reaches Redis (SPEC §13, §16): a workload through every fleet backend, with
credential-shaped values all around it, then every key and every value in the server is read
back (SCAN, TYPE, then GET / HGETALL / LRANGE / SMEMBERS / ZRANGE / XRANGE, and DUMP) and
searched for the token, its secret half, its digest (hex and raw), the credentials, and any
digest-shaped string that is not one of the chains' own record hashes.

The server is this module's own, so every key in it was written by this workload.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from controlplane.circuits import CircuitRegistry
from controlplane.core.fallback import Lineage
from controlplane.core.overlay import fold_overlay
from controlplane.decisions import Decision
from controlplane.events import EventKind
from controlplane.fleet.circuits import RedisCircuits
from controlplane.fleet.decisions import RedisDecisions
from controlplane.fleet.events import FleetEvents, FleetRevocations
from controlplane.stores.admin import AccountAdminStore
from shared.chain import ChainAuth
from shared.chainfile import HashChain
from shared.chainstorage import FileChainStorage
from shared.codes import AdminState, Condition, Outcome
from shared.fleet.capacity import RedisCapacity
from shared.fleet.chains import RedisChainStorage
from shared.fleet.hosts import HostRegistry, new_instance_id
from shared.fleet.keys import Ceiling
from shared.fleet.mirror import MirroredChainStorage
from shared.tokens import digest, new_token
from tests.integration.test_backend_contracts import _row
from tests.support.fleet import Fleet
from tests.support.harness import credential_like
from tests.support.redis_server import RedisServer

HEX_DIGEST = re.compile(rb"[0-9a-f]{64}")


async def _workload(fleet: Fleet, state_dir: Path, key_id: str) -> None:
    c, k = fleet.client, fleet.keys
    hosts = HostRegistry(c, k, ttl_s=10)
    claim = await hosts.claim("gw-1", new_instance_id())
    await hosts.heartbeat("gw-1", "inst-x", claim.epoch, claim.incarnation)
    lease = RedisCapacity(c, k, Ceiling.LEASE, "gw-1")
    request = RedisCapacity(c, k, Ceiling.REQUEST, "gw-1")
    await lease.reserve("acct-b", key_id, 20)
    await request.reserve("acct-b", "att_01J0000000000000000000000", 8)
    await lease.reregister([("acct-b", key_id, 20)])
    await RedisCapacity(c, k, Ceiling.LEASE, "gw-dead").reserve("acct-b", "k-dead", None)
    await hosts.reap_dead()

    registry = CircuitRegistry(RedisCircuits(c, k, entries=fleet.entries), cooldown_s=30)
    for n in range(3):
        await registry.on_row(
            _row(key_id, Condition.RATE_LIMITED, account_id="acct-b", attempt_id=f"att_{n}", principal_id="worker-7"),
            now_ms=1_000 + n,
        )

    decisions = RedisDecisions(c, k, entries=fleet.entries)
    decision = Decision(
        mint_decision_id="md_01J00000000000000000000000",
        outcome=Outcome.SELECTED,
        lineage=Lineage("dispatch-1", "org/repo", "claude-x"),
        at_ms=1,
        key_id=key_id,
        account_id="acct-b",
        fallback_position=0,
    )
    await decisions.record(decision)
    await decisions.record(
        Decision(
            mint_decision_id="md_held",
            outcome=Outcome.HELD,
            lineage=Lineage("dispatch-2", "org/repo", "claude-x"),
            at_ms=2,
        )
    )
    await decisions.add_evidence(decision.mint_decision_id, Condition.RATE_LIMITED)
    await decisions.claim_live(key_id, "org/repo", "dispatch-1")

    # The admin chain as the real store writes it, its authority moved to Redis.
    admin = AccountAdminStore(str(state_dir), ["acct-b"])
    admin.chain = HashChain(
        admin.chain.path,
        admin.chain.anchor_path,
        fold_overlay,
        storage=MirroredChainStorage(
            RedisChainStorage(fleet.sync, k, "account-admin"),
            FileChainStorage(admin.chain.path, admin.chain.anchor_path),
            ChainAuth(fleet.keyring.key("chain/account-admin")),
        ),
    )  # SPEC §19: each record MAC'd
    await admin.set_state(
        "acct-b",
        AdminState.DISABLED,
        reason="rotating " + key_id,
        actor="operator",
        authenticated_by="admin",
        expected_revision=0,
    )

    await FleetEvents(c, k, "gw-1", entries=fleet.entries).publish(
        EventKind.ACCOUNT_STATE, {"account_id": "acct-b", "state": "disabled"}
    )
    await FleetRevocations(c, k, "gw-1", ack_timeout_s=0.1, entries=fleet.entries).request("acct-b", ["gw-1"])


def _everything(fleet: Fleet) -> tuple[list[bytes], set[bytes]]:
    """Every key and value in the server as bytes, and the chains' own record hashes."""
    admin = fleet.admin()
    blobs: list[bytes] = []
    chain_hashes: set[bytes] = set()
    for key in admin.scan_iter(count=1000):
        kind = admin.type(key).decode()
        blobs.append(key)
        if kind == "string":
            value = admin.get(key)
            blobs.append(value)
            if key.endswith(b":records") or key.endswith(b":anchor"):
                chain_hashes.update(HEX_DIGEST.findall(value))
        elif kind == "hash":
            blobs.extend(b for pair in admin.hgetall(key).items() for b in pair)
        elif kind == "list":
            blobs.extend(admin.lrange(key, 0, -1))
        elif kind == "set":
            blobs.extend(admin.smembers(key))
        elif kind == "zset":
            blobs.extend(m for m, _ in admin.zrange(key, 0, -1, withscores=True))
        elif kind == "stream":
            blobs.extend(b for _, fields in admin.xrange(key) for pair in fields.items() for b in pair)
        else:
            raise AssertionError(f"{key!r} is a {kind}: the scan must learn to read it")
        blobs.append(admin.dump(key))
    return blobs, chain_hashes


async def test_no_credential_token_or_digest_reaches_redis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = RedisServer(tmp_path / "redis").start()
    fleet = Fleet(server)
    try:
        token, key_id, token_digest = new_token()
        credentials = [credential_like("sk-ant-api03-"), credential_like("sk-proj-")]
        monkeypatch.setenv("GATEWAY_ANTHROPIC_API_KEY", credentials[0])  # around the workload, as
        monkeypatch.setenv("GATEWAY_OPENAI_API_KEY", credentials[1])  # in a daemon's environment
        monkeypatch.setenv("GATEWAY_CONTROL_TOKEN", token)
        await _workload(fleet, tmp_path / "state", key_id)
        blobs, chain_hashes = _everything(fleet)
        assert len(blobs) > 40 and chain_hashes  # the workload wrote what it should have
        secret_half = token.split(".", 1)[1]
        forbidden = [
            token,
            secret_half,
            token_digest.hex(),
            digest(token).hex().upper(),
            base64.b64encode(token_digest).decode(),
            base64.urlsafe_b64encode(token_digest).decode(),
            "lhgw_",
            *credentials,
        ]
        everything = b"\x00".join(blobs)
        found = [f for f in forbidden if f.encode() in everything]
        assert found == [], f"found in Redis: {found}"
        assert token_digest not in everything  # the raw digest bytes, too
        material = fleet.secret._material  # SPEC §19: the fleet secret and every key made from it
        keys = [
            material,
            *(
                fleet.keyring.key(use)
                for use in ("chain/account-admin", "chain/policy", "entry/revoke", "entry/event", "entry/decision")
            ),
        ]
        for secret in keys:
            assert secret not in everything and secret.hex().encode() not in everything
            assert base64.urlsafe_b64encode(secret).rstrip(b"=") not in everything
        assert b'"mac":' in everything  # the chain records do carry their MACs
        stray = {d for blob in blobs for d in HEX_DIGEST.findall(blob)} - chain_hashes
        assert stray == set(), f"digest-shaped values in Redis that are not record hashes: {stray}"
        assert key_id.encode() in everything  # ids are fine, and the workload did use them
    finally:
        await fleet.close()
        server.stop()
