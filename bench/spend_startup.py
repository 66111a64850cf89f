"""How long control's start spends on the ledger and the spend book, for a month of ledger:
`python -m bench.spend_startup [--rows 1000000] [--days 30] [--rounds 5] [--keep DIR]`.

Writes `--rows` realistic terminal rows (40 repos, 4 roles, 6 accounts, 8 models of which one
has no price, 300 principals, a few failures without usage, priced as control prices them; each
field drawn independently, so nearly every row is its own combination — the worst case for the
fold's per-hour cells) across `--days` UTC days of one month, through the real `Ledger` with a
moving clock — so each day is rotated by the real code into `ledger-YYYYMMDD.jsonl.gz` with its
spend summary — and leaves the last day's rows up to 20:00 in the live `ledger.jsonl`. Then it
times what `controlplane.main` does before it serves: `Ledger.open()` (recovery, dedup seeding,
retention) and `SpendBook.rebuild` (the month's summaries, then the live rows), `--rounds`
times, on the same files; it checks the rebuilt month against the rows written. Then the same
with the live checkpoint (`ledger.spend.json`) written, and, for scale, one pass decoding every
row of the month from the files (what a start without summaries would pay).
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime

import msgspec

from controlplane.core.pricing import PriceLookup, cost_of
from controlplane.core.spend import ATTEMPTS, COST, Dim
from controlplane.prices import load_prices
from controlplane.spend import SpendBook
from controlplane.stores import segments
from controlplane.stores.ledger import Ledger
from shared.clock import iso_ms
from shared.logging import configure_logging
from shared.wire import AttemptRow, Usage

MONTH_START = "2026-11-01T00:00:00"
MODELS = [
    "claude-sonnet-4-6",
    "claude-opus-4-6",
    "claude-haiku-4-5",
    "claude-3-5-haiku-20241022",
    "gpt-5",
    "gpt-5-mini",
    "glm-4.6",
    "house-model-1",
]
BATCH = 32  # rows per flush, as one RPC read's worth


class Clock:
    def __init__(self, at_ms: int) -> None:
        self.now = at_ms

    def __call__(self) -> int:
        return self.now


def _ms(stamp: str) -> int:
    return int(datetime.fromisoformat(stamp).replace(tzinfo=UTC).timestamp() * 1000)


def write_month(state: str, rows: int, days: int, seed: int = 17) -> tuple[int, float, int]:
    """Write the month; returns (rows written, their total cost, the clock's `now` at the end)."""
    rng = random.Random(seed)
    price_of = PriceLookup(load_prices())
    repos = [f"org{o}/repo{r}" for o in range(3) for r in range(14)][:40]
    start = _ms(MONTH_START)
    live_until = start + (days - 1) * 86_400_000 + 20 * 3_600_000
    clock = Clock(start)
    ledger = Ledger(os.path.join(state, "ledger.jsonl"), clock=clock, retention_days=90)
    ledger.open()
    step_ms = (live_until - start) / rows
    total = 0.0
    for n in range(rows):
        clock.now = int(start + n * step_ms)
        model = rng.choice(MODELS)
        failed = rng.random() < 0.04
        usage = (
            None
            if failed
            else Usage(
                input_tokens=rng.randrange(50, 4000),
                output_tokens=rng.randrange(10, 2000),
                cache_read_tokens=rng.randrange(0, 30_000),
                cache_creation_tokens=rng.randrange(0, 3000),
            )
        )
        cost, reason = cost_of(price_of, model, usage)
        total += cost or 0.0
        stamp = iso_ms(clock.now)
        ledger.stage(
            AttemptRow(
                attempt_id=f"att_{n:010d}",
                key_id=f"key_{rng.randrange(5000):05d}",
                account_id=f"acct-{rng.randrange(6)}",
                mint_decision_id=f"md_{n:010d}",
                dispatch_id=f"d-{n // 7}",
                repo_slug=rng.choice(repos),
                principal_id=f"worker-{rng.randrange(300)}",
                wire="anthropic",
                path="/v1/messages",
                requested_model=model,
                served_model=model,
                stream=rng.random() < 0.7,
                started_at=stamp,
                finished_at=stamp,
                status="upstream-error" if failed else "completed",
                http_status=529 if failed else 200,
                condition="overloaded" if failed else None,
                refusal_reason=None,
                usage=usage,
                cost_usd=cost,
                cost_reason=str(reason),
                overhead_ms=round(rng.uniform(0.1, 2.0), 3),
                principal_kind="worker",
                worker_role=rng.choice([None, "coder", "reviewer", "planner"]),
                bytes_out=rng.randrange(200, 90_000),
                duration_ms=round(rng.uniform(200, 90_000), 1),
            )
        )
        if n % BATCH == BATCH - 1:
            ledger.flush()
    ledger.close()
    return rows, total, live_until


def startup(state: str, at_ms: int) -> tuple[float, float, SpendBook]:
    clock = Clock(at_ms)
    began = time.perf_counter()
    ledger = Ledger(os.path.join(state, "ledger.jsonl"), clock=clock, retention_days=90)
    ledger.open()
    opened = time.perf_counter()
    book = SpendBook.rebuild(ledger)
    rebuilt = time.perf_counter()
    ledger.close()
    return opened - began, rebuilt - opened, book


def rounds(state: str, at_ms: int, count: int) -> tuple[list[float], list[float], SpendBook]:
    opens, rebuilds, book = [], [], None
    for _ in range(count):
        o, r, book = startup(state, at_ms)
        opens.append(o)
        rebuilds.append(r)
    assert book is not None
    return opens, rebuilds, book


def decode_everything(state: str) -> tuple[int, float]:
    """One pass over every row of every file: what a start without summaries would do."""
    decode = msgspec.json.Decoder(segments.LedgerRow).decode
    began, count = time.perf_counter(), 0
    for name in sorted(os.listdir(state)):
        if name.endswith(".jsonl.gz") or name == "ledger.jsonl":
            path = os.path.join(state, name)
            with gzip.open(path, "rb") if name.endswith(".gz") else open(path, "rb") as handle:
                for line in handle:
                    decode(line)
                    count += 1
    return count, time.perf_counter() - began


def _figures(label: str, opens: list[float], rebuilds: list[float]) -> str:
    totals = [o + r for o, r in zip(opens, rebuilds)]
    return (
        f"{label}: ledger open {statistics.median(opens) * 1000:.0f} ms + spend rebuild "
        f"{statistics.median(rebuilds) * 1000:.0f} ms = {statistics.median(totals) * 1000:.0f} ms median "
        f"(best {min(totals) * 1000:.0f}, worst {max(totals) * 1000:.0f}, {len(totals)} rounds)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keep", metavar="DIR", help="write the month here and keep it (default: a temp dir)")
    args = parser.parse_args()
    configure_logging("bench", "warning")
    state = args.keep or tempfile.mkdtemp(prefix="leasehold-spend-")
    os.makedirs(state, exist_ok=True)
    try:
        began = time.perf_counter()
        written, total, at_ms = write_month(state, args.rows, args.days)
        sizes = {n: os.path.getsize(os.path.join(state, n)) for n in os.listdir(state)}
        live_rows = sum(1 for _ in open(os.path.join(state, "ledger.jsonl"), "rb"))
        print(
            f"wrote {written:,} rows over {args.days} days in {time.perf_counter() - began:.0f} s: "
            f"{sum(1 for n in sizes if n.endswith('.gz'))} segments "
            f"({sum(v for n, v in sizes.items() if n.endswith('.gz')) / 1e6:.0f} MB gzipped, summaries "
            f"{sum(v for n, v in sizes.items() if n.endswith('.spend.json')) / 1e6:.1f} MB), live ledger.jsonl "
            f"{sizes['ledger.jsonl'] / 1e6:.0f} MB ({live_rows:,} rows)"
        )
        opens, rebuilds, book = rounds(state, at_ms, args.rounds)
        month = book.fold.cell("2026-11", Dim.PLATFORM, "")
        assert month[ATTEMPTS] == written and abs(month[COST] - total) < 1e-6 * max(1.0, total), (month, total)
        print(_figures("start, summaries + every live row", opens, rebuilds))
        book.ledger = Ledger(os.path.join(state, "ledger.jsonl"), clock=Clock(at_ms))
        book.ledger.open()
        book.checkpoint()
        book.ledger.close()
        opens, rebuilds, book = rounds(state, at_ms, args.rounds)
        assert book.fold.cell("2026-11", Dim.PLATFORM, "")[ATTEMPTS] == written
        print(
            _figures(f"start, summaries + live checkpoint ({book.loaded['live_rows']} rows after it)", opens, rebuilds)
        )
        count, seconds = decode_everything(state)
        print(f"for scale: decoding all {count:,} rows from the files once takes {seconds:.1f} s")
    finally:
        if not args.keep:
            shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
