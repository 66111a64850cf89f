"""The embedded decision table's journal cost per mint, per terminal row and per key end (SPEC §5).

`JournalledDecisions` over a real `lease-decisions.jsonl` in a temporary directory, in process:
each round records a lease-bearing decision (the mint's path: one line before the grant), adds a
terminal row's evidence (the rows' path) and ends the key (the end's path, where compactions run).
The clock is injected and advances `--step-ms` a round (1,000: a mint a second), so the decisions
ended over an hour ago are let go as in steady state. `--tree DIR` runs another checkout's code
(for a before/after: `git archive <rev> controlplane shared | tar -x -C DIR`); a tree whose
`LeaseDecisions` takes no clock runs on the wall clock.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _summary(name: str, ns: list[int]) -> str:
    ns.sort()
    mean = sum(ns) / len(ns) / 1000
    p50, p99, top = ns[len(ns) // 2] / 1000, ns[int(len(ns) * 0.99)] / 1000, ns[-1] / 1000
    return f"{name:20s} mean {mean:7.2f} us  p50 {p50:6.2f}  p99 {p99:7.2f}  max {top:9.1f}"


async def measure(rounds: int, step_ms: int) -> list[str]:
    from controlplane.core.fallback import Lineage
    from controlplane.decisions import Decision
    from controlplane.stores.decisions import JournalledDecisions
    from controlplane.stores.leasedecisions import LeaseDecisions
    from shared.codes import Outcome
    from shared.wire import Lease

    now = [1_000_000_000_000]
    live: dict[str, Lease] = {}
    path = os.path.join(tempfile.mkdtemp(prefix="decision-journal-"), "lease-decisions.jsonl")
    try:
        journal: Any = LeaseDecisions(path, live.get, lambda: now[0])  # type: ignore[call-arg,unused-ignore]
    except TypeError:  # a tree from before the injected clock
        journal = LeaseDecisions(path, live.get)
    table = JournalledDecisions(journal)
    table.restore([])
    record: list[int] = []
    evidence: list[int] = []
    end: list[int] = []
    for n in range(rounds):
        now[0] += step_ms
        key = f"K{n:08d}"
        decision = Decision(
            mint_decision_id=f"md_{n:08d}",
            outcome=Outcome.SELECTED,
            lineage=Lineage(f"d-{n}", "acme/app", "claude-sonnet-4-6"),
            at_ms=now[0],
            key_id=key,
            account_id="legacy-anthropic",
            fallback_position=0,
            effective_model="claude-sonnet-4-6",
        )
        live[key] = Lease(key_id=key, digest=b"", account_id="a", expires_at_ms=1 << 60, repo_slug="acme/app")
        t0 = time.perf_counter_ns()
        await table.record(decision)
        record.append(time.perf_counter_ns() - t0)
        t0 = time.perf_counter_ns()
        await table.add_evidence(decision.mint_decision_id, None)
        evidence.append(time.perf_counter_ns() - t0)
        del live[key]
        t0 = time.perf_counter_ns()
        await table.end_key(key)
        end.append(time.perf_counter_ns() - t0)
    table.close()
    return [
        _summary("record (mint)", record),
        _summary("add_evidence (row)", evidence),
        _summary("end_key (end)", end),
        f"journal bytes at the end: {os.path.getsize(path)}",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30_000)
    parser.add_argument("--step-ms", type=int, default=1_000)
    parser.add_argument("--tree", type=Path, default=None, help="another checkout's controlplane and shared")
    args = parser.parse_args()
    if args.tree is not None:
        sys.path.insert(0, str(args.tree.resolve()))
    for line in asyncio.run(measure(args.rounds, args.step_ms)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
