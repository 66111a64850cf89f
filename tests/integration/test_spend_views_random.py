"""A seeded random run (print the seed; `SPEND_SEED=n` replays one): rows recorded through the
real `ControlService` over simulated days that cross a leap day and a month's end, with re-sent
rows, timer ticks, clean restarts and rotations that crash part-way; after each step the spend
and budgets views answered over HTTP match a recount of the ledger files on disk."""

from __future__ import annotations

import os
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

from controlplane.core.windows import Window, key_at
from controlplane.main import build_app
from controlplane.stores.ledger import Ledger
from tests.support.control import make_control
from tests.support.harness import credential_like
from tests.support.ledgerfiles import FakeClock, rows_on_disk, stamp_of
from tests.support.rows import row

TOKEN = credential_like("ctl_")
TEAM_OF = {"acme/pay": "payments", "acme/ledger": "payments", "acme/web": "web"}
ORG_OF = {"payments": "acme"}
REPOS = [*TEAM_OF, "solo/x"]
MODELS = ["claude-sonnet-4-6", "claude-haiku-4-5", "gpt-5", "claude-house-1"]  # the last has no price
POLICY = [
    ("org:acme", {"teams": ["payments"], "budgets": [{"window": "month", "usd": 40}]}),
    ("team:payments", {"repos": ["acme/pay", "acme/ledger"], "budgets": [{"window": "day", "usd": 3}]}),
    ("team:web", {"repos": ["acme/web"]}),
    ("repo:acme/pay", {"budgets": [{"window": "day", "usd": 5}, {"window": "hour", "usd": 0.5}]}),
    ("binding:solo/x#writer", {"budgets": [{"window": "hour", "usd": 0.2}]}),
    ("platform", {"budgets": [{"window": "month", "usd": 100}]}),
    ("repo:acme/web", {"budgets": [{"window": "hour", "usd": 0.15}, {"window": "day", "usd": 1}]}),
]
BYS = ["repo", "team", "org", "account", "model", "principal", "binding"]


class Crash(BaseException):
    pass


class Control:
    """One control process's worth of state on the shared directory, on the test's clock (the
    live file's mtime follows it too: a ledger reads its file's day from its last write)."""

    def __init__(self, state: Path, clock: FakeClock, on_step) -> None:
        env = {
            "GATEWAY_STATE_DIR": str(state),
            "GATEWAY_RUNTIME_DIR": str(state.parent / "run"),
            "GATEWAY_CONTROL_TOKEN": TOKEN,
        }
        self.ledger = Ledger(str(state / "ledger.jsonl"), clock=clock, on_step=on_step)
        self.ledger.open()
        self.wired = make_control(state, settings=env, env=env, keys_journal=False, ledger=self.ledger)
        self.settings, self.service = self.wired.settings, self.wired.service
        self.client: Any = None
        self.clock = clock

    async def record(self, r: Any) -> None:
        self.service.record(r)
        await self.service.settle()  # written now, so the mtime below is the write's
        live = self.ledger.path
        if os.path.exists(live):
            os.utime(live, ns=(self.clock.now * 1_000_000,) * 2)


def recount(rows: list[dict], window: Window, at_ms: int, by: str) -> dict[Any, tuple]:
    key = key_at(window, at_ms)
    groups: dict[Any, list] = defaultdict(lambda: [0.0, 0, 0, 0, 0, 0, 0])
    for r in rows:
        if not r["finished_at"].startswith(key):
            continue
        repo, role = r["repo_slug"], r["worker_role"]
        team = TEAM_OF.get(repo)
        group = {
            "repo": repo,
            "team": team,
            "org": ORG_OF.get(team) if team else None,
            "account": r["account_id"],
            "model": r["served_model"] or r["requested_model"],
            "principal": r["principal_id"],
            "binding": f"{repo}#{role}" if role else None,
        }[by]
        cell, usage = groups[group], r["usage"] or {}
        cell[0] += r["cost_usd"] or 0.0
        cell[1] += 1
        cell[2] += r["cost_reason"] == "unpriced"  # no price, or a served answer without usage (SPEC §19)
        for i, kind in enumerate(("input_tokens", "output_tokens", "cache_read_tokens", "cache_creation_tokens"), 3):
            cell[i] += usage.get(kind, 0)
    return {k: tuple(v) for k, v in groups.items()}


def scope_spend(rows: list[dict], level: str, window: Window, at_ms: int) -> float:
    kind, _, name = level.partition(":")
    by = {"platform": None, "org": "org", "team": "team", "repo": "repo", "binding": "binding"}[kind]
    counted = recount(rows, window, at_ms, by or "repo")
    if by is None:
        return sum(v[0] for v in counted.values())
    return counted.get(name, (0.0,))[0]


async def check_views(control: Control, state: Path, clock: FakeClock, seed: int, step: int) -> None:
    await control.service.settle()  # the recorded rows written
    control.ledger.wait_idle()
    rows = rows_on_disk(state)
    assert len({r["attempt_id"] for r in rows}) == len(rows), f"seed={seed} step={step}: a row twice on disk"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for window in Window:
        for by in BYS:
            response = await control.client.get(f"/control/v2/spend?window={window}&by={by}", headers=headers)
            body = await response.json()
            got = {
                r["key"]: (r["cost_usd"], r["attempts"], r["unpriced_attempts"], *r["usage"].values())
                for r in body["rows"]
            }
            expect = recount(rows, window, clock.now, by)
            where = f"seed={seed} step={step} {window} by {by}"
            assert {k: v[1:] for k, v in got.items()} == {k: v[1:] for k, v in expect.items()}, where
            assert all(abs(got[k][0] - expect[k][0]) < 1e-6 for k in got), where
    response = await control.client.get("/control/v2/budgets", headers=headers)
    statuses = (await response.json())["budgets"]
    for status in statuses:
        expect = scope_spend(rows, status["level"], Window(status["window"]), clock.now)
        assert abs(status["spent_usd"] - expect) < 1e-6, f"seed={seed} step={step} {status}"
        assert status["exhausted"] == (status["spent_usd"] >= status["usd"])
    guard = control.wired.budgets  # enforcement's running tally agrees with the view's recount
    guard.tick()  # as its timer does at the hour's end
    held = {(e.level, str(e.window)) for e in guard.watch.exhausted(guard.watch.budgets, clock.now)}
    assert held == {(s["level"], s["window"]) for s in statuses if s["exhausted"]}, f"seed={seed} step={step}"


async def test_the_views_match_a_recount_of_the_ledger_files(app_client, tmp_path: Path) -> None:
    seed = int(os.environ.get("SPEND_SEED") or random.randrange(1 << 30))
    print(f"seed={seed}")
    rng = random.Random(seed)
    state = tmp_path / "state"
    state.mkdir()
    clock = FakeClock("2028-02-27T21:00:00")
    crash = {"at": None}

    def on_step(step: str) -> None:
        if crash["at"] == step:
            crash["at"] = None
            raise Crash(step)

    control = Control(state, clock, on_step)
    control.client = await app_client(build_app(control.wired))
    for revision, (name, document) in enumerate(POLICY):
        response = await control.client.put(
            "/control/v2/policy/level",
            headers={"Authorization": f"Bearer {TOKEN}"},
            json={"name": name, "expected_revision": revision, "document": document, "reason": "random"},
        )
        assert response.status == 200
    recent: list = []
    for step in range(70):
        clock.advance(rng.choice([60, 600, 1800, 3600 * 3, 3600 * 11]))
        for _ in range(rng.randrange(0, 25)):
            finished = clock.now - rng.randrange(0, 120_000 if rng.random() < 0.9 else 900_000)  # some arrive late
            r = row(
                stamp_of(finished),
                repo=rng.choice(REPOS),
                role=rng.choice([None, "writer", "reviewer"]),
                account=rng.choice(["legacy-anthropic", "legacy-openai"]),
                model=rng.choice(MODELS),
                principal=rng.choice(["w-1", "w-2", "w-3"]),
                usage=(rng.randrange(5000), rng.randrange(5000), rng.randrange(500), 0) if rng.random() < 0.9 else None,
            )
            await control.record(r)
            recent = (recent + [r])[-20:]
        if recent and rng.random() < 0.3:  # the data plane re-sends rows it saw no Ack for
            await control.record(rng.choice(recent))
        roll = rng.random()
        if roll < 0.15:  # the rotation (at the next write of a new day, or now) dies at a step
            crash["at"] = rng.choice(["compressed", "summarised", "summary-placed", "placed", "unlinked"])
        if roll < 0.4:
            control.ledger.rotate_if_due()
            control.ledger.wait_idle()
        elif roll < 0.5:  # a tick of the upkeep timer, with a checkpoint
            control.wired.spend.tick(force_checkpoint=True)
        if rng.random() < 0.15:  # a restart: clean, or after a crashed rotation
            await control.service.settle()  # as the daemon's shutdown does: every recorded row written
            control.ledger.wait_idle()
            await control.client.close()
            if rng.random() < 0.5:
                control.ledger.close()
            try:
                control = Control(state, clock, on_step)
            except Crash:  # the start died finishing that rotation: start again
                control = Control(state, clock, on_step)
            control.client = await app_client(build_app(control.wired))
            if recent:
                await control.record(recent[-1])  # re-sent after the restart: still a duplicate
        await check_views(control, state, clock, seed, step)
    control.ledger.wait_idle()
    await control.client.close()
    control.ledger.close()
    assert any(name.endswith(".jsonl.gz") for name in os.listdir(state)), f"seed={seed}: no rotation happened"
