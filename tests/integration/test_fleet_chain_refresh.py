"""A mint's chain refresh (issue 27): while the chain in Redis and this host's mirror are as the
cached view read them, the view is validated by one asyncio call and a stat, with no worker
thread and no full read; any change (another host's append, a forged record, a mirror edit)
makes the refresh read and verify the whole chain again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shared.chain import ChainAuth, Verdict
from shared.chainfile import HashChain
from shared.chainstorage import FileChainStorage
from shared.fleet.chains import RedisChainStorage
from shared.fleet.mirror import MirroredChainStorage
from shared.fleet.secret import FleetSecret
from tests.integration.test_fleet_chain_macs import ENABLE, forge
from tests.support.fleet import Fleet

SECRET = FleetSecret(b"fleet-secret-for-these-tests-32b!")
NAME = "account-admin"


def host(fleet: Fleet, state_dir: Path) -> HashChain[list[dict[str, Any]]]:
    state_dir.mkdir(parents=True, exist_ok=True)
    path, anchor = str(state_dir / "account-admin.jsonl"), str(state_dir / "account-admin-head.json")
    auth = ChainAuth(SECRET.key(fleet.keys.fleet_id, "chain/" + NAME), lambda: {"actor": "host:x"})
    remote = RedisChainStorage(fleet.sync, fleet.keys, NAME, aclient=fleet.client)
    return HashChain(
        path, anchor, list, storage=MirroredChainStorage(remote, FileChainStorage(path, anchor), auth), recent_s=2.0
    )


def commit(chain: HashChain, state: str) -> int:
    return chain.commit(lambda _c: {"action": "set-state", "account_id": "team-a", "state": state}).revision


async def test_an_unchanged_chain_is_refreshed_without_a_full_read(fleet: Fleet, tmp_path: Path) -> None:
    a, b = host(fleet, tmp_path / "a"), host(fleet, tmp_path / "b")
    assert commit(a, "disabled") == 1
    assert (await b.refresh()).check.revision == 1  # b's mirror copies the chain
    first = await b.refresh()  # read once more with it: settled
    reads = b.full_reads
    for _ in range(3):
        assert await b.refresh() is first
    assert b.full_reads == reads and b.read_recent() is first
    assert commit(a, "enabled") == 2  # another host's append
    second = await b.refresh()
    assert second.check.revision == 2 and second.state is not None and second.state[-1]["state"] == "enabled"
    assert b.full_reads > reads
    assert (await b.refresh()).check.revision == 2  # its mirror caught up: settles again
    settled = b.full_reads
    assert await b.refresh() is await b.refresh() and b.full_reads == settled
    forge(fleet, ENABLE)  # a writer without the secret
    assert (await b.refresh()).check.verdict is Verdict.CORRUPT
