"""Control's cost per attempt report, measured alone: `python -m bench.control_rows [--rows N]`.

What the control daemon does for each attempt of a saturation run — decode an `AttemptStarted`
frame and a 2xx `AttemptFinished` frame, record the row (price, ledger append, routes, events,
metrics, spend, evidence, circuits, decisions) and queue the `Ack` — run in one process against a
real `ControlService` and `GatewayMetrics` wired as `controlplane.main` wires them, with the
ledger in a temporary directory. No sockets: this is the CPU the shared core pays per request
for control, without the scheduler's noise. Prints µs per attempt (best of three rounds).

Rows finish now (the windows in progress, as live traffic does). `--budgets` first writes a
policy with budgets on every level of the rows' chain (platform, team, repo; amounts never
reached), so each priced row also goes through budget enforcement's check (SPEC §18).

It also prints the process's CPU per attempt (best round), which a loaded machine inflates
less than the wall time. `--traces` turns span export on (SPEC §21) towards a real OTLP/HTTP
receiver in its own process (tests/support/otlp_receiver.py), with a queue as large as a round so
no span is dropped; the CPU then includes the exporter thread's (each round ends by flushing the
queue to the receiver).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from controlplane.core.policy import Ceiling
from controlplane.main import wire
from controlplane.prices import load_prices
from controlplane.registry import Registry
from controlplane.service import ControlService
from controlplane.stores.keys import KeyTable
from controlplane.stores.ledger import Ledger
from controlplane.stores.policy import PolicyStore
from shared.clock import iso_ms, now_ms
from shared.codes import Condition
from shared.rpc import _HEADER, decode_body, encode_frame
from shared.settings import load_settings
from shared.tokens import new_ulid
from shared.wire import Acks, AttemptFinished, AttemptRow, AttemptStarted, RateLimit, RateLimits, Usage
from tests.support.waits import wait_until


class _Conn:
    """Stands in for the RPC connection: counts the rows control acknowledges (one `Ack` each, or
    one `Acks` frame per settle for all of them)."""

    def __init__(self) -> None:
        self.sent = 0

    def send_nowait(self, message: object, lazy: bool = False) -> None:
        del lazy
        self.sent += len(message.req_ids) if isinstance(message, Acks) else 1


BUDGETS = [
    ("team:widgets", {"repos": ["acme/widgets"], "budgets": [{"window": "day", "usd": 1e9}]}),
    ("platform", {"budgets": [{"window": "month", "usd": 1e9}]}),
    ("repo:acme/widgets", {"budgets": [{"window": "hour", "usd": 1e9}, {"window": "day", "usd": 1e9}]}),
]


async def _write_budgets(state: str) -> None:
    store = PolicyStore(state, ["anthropic-default"], Ceiling(fallback_on=frozenset(Condition), max_fallback_hops=1))
    for revision, (name, document) in enumerate(BUDGETS):
        await store.put_level(
            name, document, expected_revision=revision, reason="bench", actor=None, authenticated_by="control-token"
        )


def _rate_limits(stamp: str, reset: str) -> RateLimits:
    """A provider's full set, as the data plane reports Anthropic's headers (SPEC §22)."""
    return RateLimits(
        observed_at=stamp,
        requests=RateLimit(limit=4000, remaining=3999, reset_at=reset),
        tokens=RateLimit(limit=2_000_000, remaining=1_999_000, reset_at=reset),
        input_tokens=RateLimit(limit=1_600_000, remaining=1_599_000, reset_at=reset),
        output_tokens=RateLimit(limit=400_000, remaining=399_000, reset_at=reset),
    )


def _frames(count: int, rate_limits: bool = False) -> list[bytes]:
    frames = []
    stamp = iso_ms(now_ms())
    limits = _rate_limits(stamp, iso_ms(now_ms() + 60_000)) if rate_limits else None
    for _ in range(count):
        attempt_id = "att_" + new_ulid()
        row = AttemptRow(
            attempt_id=attempt_id,
            key_id="key_" + new_ulid(),
            account_id="anthropic-default",
            mint_decision_id=None,
            dispatch_id=None,
            repo_slug="acme/widgets",
            principal_id="bench",
            wire="anthropic",
            path="/v1/messages",
            requested_model="claude-sonnet-4-5",
            served_model=None,
            stream=False,
            started_at="2026-11-30T12:00:00.000Z",
            finished_at=None,
            status=None,
            http_status=None,
            condition=None,
            refusal_reason=None,
            usage=None,
            cost_usd=None,
            cost_reason=None,
            overhead_ms=None,
            principal_kind="user",
        )
        done = AttemptRow(
            **{
                **{f: getattr(row, f) for f in row.__struct_fields__},
                "served_model": "claude-sonnet-4-5-20250929",
                "finished_at": stamp,
                "status": "completed",
                "http_status": 200,
                "usage": Usage(input_tokens=12, output_tokens=30),
                "overhead_ms": 0.21,
                "duration_ms": 3.9,
                "bytes_out": 512,
                "rate_limits": limits,
            }
        )
        frames.append(encode_frame(AttemptStarted(row=row)))
        frames.append(encode_frame(AttemptFinished(req_id=len(frames), row=done)))
    return frames


async def _round(service: ControlService, frames: list[bytes], per_read: int) -> float:
    conn = _Conn()
    started = time.perf_counter()
    for n, frame in enumerate(frames, 1):
        service.handle(conn, decode_body(frame[_HEADER.size :]))  # type: ignore[arg-type]
        if n % per_read == 0:
            service.read_done()  # the end of one RPC read, as the link's reader says it
            await asyncio.sleep(0)  # staged rows are written and acked
    service.read_done()
    await service.settle()
    elapsed = time.perf_counter() - started
    assert conn.sent == len(frames) // 2, "every finished row must be acknowledged"
    return elapsed


def _receiver(state: str) -> tuple[subprocess.Popen[bytes], str]:
    port_file = Path(state) / "otlp.port"
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.otlp_receiver", "--port-file", str(port_file)])
    port = wait_until(lambda: port_file.exists() and port_file.read_text().strip(), 20, "the OTLP receiver")
    return proc, f"http://127.0.0.1:{port}"


async def measure(
    rows: int,
    rounds: int = 3,
    per_read: int = 16,
    budgets: bool = False,
    traces: bool = False,
    rate_limits: bool = False,
) -> tuple[float, float]:
    """µs per attempt on the event loop (best round) and the process's CPU µs per attempt (best
    round; with `traces`, the exporter thread's included: each round ends with a flush)."""
    with tempfile.TemporaryDirectory() as state:
        if budgets:
            await _write_budgets(state)
        env = {
            "GATEWAY_STATE_DIR": state,
            "GATEWAY_RUNTIME_DIR": state,
            "GATEWAY_CONTROL_TOKEN": "bench-token-" + "x" * 24,
        }
        receiver = None
        if traces:
            receiver, endpoint = _receiver(state)
            env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_MAX_QUEUE_SIZE": str(rows + 1)})
        settings = load_settings(env)
        keys = KeyTable(os.path.join(state, "keys.jsonl"))
        keys.load(0)
        ledger = Ledger(os.path.join(state, "ledger.jsonl"))
        ledger.open()
        control = wire(
            settings,
            Registry.from_settings(settings),
            keys,
            ledger,
            load_prices(),
            env={"GATEWAY_ANTHROPIC_API_KEY": "x"},
        )
        if control.traces is not None:
            control.traces.start()
        best, best_cpu = float("inf"), float("inf")
        try:
            for _ in range(rounds):
                frames = _frames(rows, rate_limits)
                cpu = time.process_time()
                best = min(best, await _round(control.service, frames, per_read))
                if control.traces is not None:
                    control.traces.flush()
                best_cpu = min(best_cpu, time.process_time() - cpu)
            if control.traces is not None:
                assert control.traces.dropped == 0, f"{control.traces.dropped} spans dropped"
                control.traces.shutdown()
        finally:
            if receiver is not None:
                receiver.terminate()
                receiver.wait(10)
        ledger.close()
        keys.close()
    return best / rows * 1e6, best_cpu / rows * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--per-read", type=int, default=16, help="frames per RPC read (a batch)")
    parser.add_argument("--budgets", action="store_true", help="budgets on every level of the rows' chain")
    parser.add_argument("--traces", action="store_true", help="span export on, to an OTLP receiver (SPEC §21)")
    parser.add_argument("--rate-limits", action="store_true", help="each row carries a provider's full set (SPEC §22)")
    args = parser.parse_args()
    per_attempt, cpu = asyncio.run(
        measure(
            args.rows, per_read=args.per_read, budgets=args.budgets, traces=args.traces, rate_limits=args.rate_limits
        )
    )
    extras = (
        (", budgets on the chain" if args.budgets else "")
        + (", span export on" if args.traces else "")
        + (", rate limits on every row" if args.rate_limits else "")
    )
    print(
        f"control: {per_attempt:.1f} µs per attempt (started + finished report, {args.per_read} frames "
        f"per read, best of 3 rounds of {args.rows:,}{extras})"
    )
    print(
        f"control: {cpu:.1f} µs of CPU per attempt"
        + (" including the exporter thread (spans flushed to the receiver each round)" if args.traces else "")
    )


if __name__ == "__main__":
    main()
