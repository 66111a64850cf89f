"""`PolicyStore` on real files: one write = one append, revision = length, 409, 422, tamper holds."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from controlplane.core.policy import Ceiling
from controlplane.stores.policy import ANCHOR_FILE, CHAIN_FILE, PolicyStore
from shared.chain import Verdict, record_hash
from shared.codes import Condition, ErrorCode, Refusal
from shared.errors import GatewayError

ACCOUNTS = ("legacy-anthropic", "legacy-zai-harness", "legacy-openai", "anthropic-team-b")
CEILING = Ceiling(fallback_on=frozenset(Condition), max_fallback_hops=2)
RECORD_FIELDS = {"seq", "prev_hash", "hash", "at", "actor", "actor_authenticated_by", "name", "document", "reason"}


def make_store(tmp_path: Path) -> PolicyStore:
    return PolicyStore(str(tmp_path), ACCOUNTS, CEILING)


async def put(store: PolicyStore, name: str, document: dict[str, Any], expected: int) -> Any:
    return await store.put_level(
        name, document, expected_revision=expected, reason="ticket 7", actor="alice", authenticated_by="control-token"
    )


def lines(tmp_path: Path) -> list[bytes]:
    return (tmp_path / CHAIN_FILE).read_bytes().splitlines(keepends=True)


def test_no_chain_is_no_policy(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    assert store.read().check.verdict is Verdict.ABSENT
    assert not store.is_unavailable()
    resolved = store.resolve("acme/app", "reviewer")
    assert resolved.revision == 0 and resolved.account_order is None
    assert resolved.fallback_on == frozenset(Condition) and resolved.max_fallback_hops == 2


async def test_one_write_is_one_append_of_the_whole_document(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    written = await put(store, "team:payments", {"repos": ["acme/pay"], "account_order": ["anthropic-team-b"]}, 0)
    assert (written.name, written.revision, written.based_on_revision) == ("team:payments", 1, 0)
    (line,) = lines(tmp_path)
    record = json.loads(line)
    assert set(record) == RECORD_FIELDS and record == written.record
    assert record["document"] == {"repos": ["acme/pay"], "account_order": ["anthropic-team-b"]}
    assert record_hash(record) == record["hash"] and record["seq"] == 1
    assert json.loads((tmp_path / ANCHOR_FILE).read_bytes()) == {"count": 1, "head_hash": record["hash"]}
    resolved = store.resolve("acme/pay", None)
    assert resolved.revision == 1 and resolved.account_order == ("anthropic-team-b",)
    assert resolved.provenance["account_order"] == "team:payments"
    assert store.resolve("acme/other", None).account_order is None

    await put(store, "team:payments", {"repos": ["acme/pay"]}, 1)
    assert len(lines(tmp_path)) == 2
    assert store.resolve("acme/pay", None).account_order is None  # the level was replaced whole


async def test_a_stale_expected_revision_is_409_naming_the_current_one(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    await put(store, "platform", {"max_fallback_hops": 1}, 0)
    with pytest.raises(GatewayError) as refused:
        await put(store, "platform", {"max_fallback_hops": 0}, 0)
    assert refused.value.status == 409 and refused.value.code == "revision-conflict"
    assert refused.value.extra["current_revision"] == 1
    assert len(lines(tmp_path)) == 1


async def test_concurrent_writers_on_one_revision_exactly_one_wins(tmp_path: Path) -> None:
    stores = [make_store(tmp_path) for _ in range(4)]  # separate instances: the file lock decides
    results = await asyncio.gather(
        *(put(s, f"repo:acme/r{n}", {"max_fallback_hops": 1}, 0) for n, s in enumerate(stores)), return_exceptions=True
    )
    won = [r for r in results if not isinstance(r, BaseException)]
    lost = [r for r in results if isinstance(r, GatewayError)]
    assert len(won) == 1 and len(lost) == 3
    assert all(e.status == 409 for e in lost)
    assert len(lines(tmp_path)) == 1


@pytest.mark.parametrize(
    "name, document, problem, names",
    [
        ("platform", {"account_order": ["ghost"]}, "unknown-account", ["ghost"]),
        ("platform", {"pair_order": []}, "unknown-field", ["pair_order"]),
        ("repo:acme/app", {"providers": ["bedrock"]}, "unknown-binding", ["bedrock"]),
        ("repo:acme/app", {"fallback_on": ["any"]}, "unknown-condition", ["any"]),
        ("team:t", {"locks": ["repos"]}, "unknown-lock", ["repos"]),
        ("tenant:x", {}, "invalid-level", ["tenant:x"]),
    ],
)
async def test_refused_writes_append_nothing(
    tmp_path: Path, name: str, document: dict, problem: str, names: list[str]
) -> None:
    store = make_store(tmp_path)
    with pytest.raises(GatewayError) as refused:
        await put(store, name, document, 0)
    assert refused.value.status == 422 and refused.value.code == ErrorCode.INVALID_REQUEST
    assert [(p["problem"], p["names"]) for p in refused.value.extra["problems"]] == [(problem, names)]
    assert not (tmp_path / CHAIN_FILE).exists()


async def test_a_repo_claimed_by_a_second_team_is_refused_from_the_file(tmp_path: Path) -> None:
    first, second = make_store(tmp_path), make_store(tmp_path)
    await put(first, "team:payments", {"repos": ["acme/pay"]}, 0)
    with pytest.raises(GatewayError) as refused:
        await put(second, "team:infra", {"repos": ["acme/pay"]}, 1)
    assert refused.value.status == 422
    assert refused.value.extra["problems"][0]["problem"] == "tenancy-conflict"
    assert len(lines(tmp_path)) == 1


async def test_a_tampered_chain_is_unavailable_and_refuses_writes(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    await put(store, "platform", {"account_order": ["legacy-anthropic"]}, 0)
    await put(store, "repo:acme/app", {"max_fallback_hops": 0}, 1)
    path = tmp_path / CHAIN_FILE
    path.write_bytes(path.read_bytes().replace(b'"max_fallback_hops":0', b'"max_fallback_hops":1'))
    assert store.is_unavailable()
    assert store.read().check.verdict is Verdict.CORRUPT
    with pytest.raises(GatewayError) as held:
        store.resolve("acme/app", None)
    assert held.value.code == Refusal.POLICY_UNAVAILABLE
    with pytest.raises(GatewayError) as refused:
        await put(store, "platform", {}, 2)
    assert refused.value.code == Refusal.POLICY_UNAVAILABLE and refused.value.status == 503
    assert refused.value.extra["chain_verdict"] == "corrupt"


async def test_a_truncated_chain_is_caught_by_its_anchor(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    await put(store, "platform", {"max_fallback_hops": 1}, 0)
    await put(store, "platform", {"max_fallback_hops": 0}, 1)
    path = tmp_path / CHAIN_FILE
    path.write_bytes(b"".join(lines(tmp_path)[:1]))  # drop the newest record: it links perfectly
    assert store.is_unavailable()


async def test_a_resolution_is_folded_once_per_chain_view_and_again_after_a_write(tmp_path: Path) -> None:
    """Issue 27: a mint resolves its (repo, role) without folding again while the chain is
    unchanged; a write (here, or by another process on the same files) is obeyed at once."""
    store = make_store(tmp_path)
    await put(store, "team:payments", {"repos": ["acme/pay"], "account_order": ["anthropic-team-b"]}, 0)
    first = store.resolve("acme/pay", None)
    assert store.resolve("acme/pay", None) is first  # the same view: not folded again
    assert store.resolve("acme/pay", "reviewer") is not first  # another role: its own fold
    await put(store, "team:payments", {"repos": ["acme/pay"], "account_order": ["legacy-anthropic"]}, 1)
    assert store.resolve("acme/pay", None).account_order == ("legacy-anthropic",)
    other = make_store(tmp_path)  # another writer of the same chain
    await put(other, "team:payments", {"repos": ["acme/pay"], "account_order": ["legacy-openai"]}, 2)
    assert store.resolve("acme/pay", None).account_order == ("legacy-openai",)
    assert store.resolve("acme/pay", None).revision == 3
