"""What control records of a fixed set of attempt reports, compared between checkouts:
`python -m bench.control_outputs TREE [TREE ...]`.

A cut of control's row path (issue 27) must change no byte of what is recorded, answered or
logged. This feeds the same ~600 reports (fixed ids and stamps in the hour in progress; priced,
unpriced, not-billed and usage-less rows, refusals, aborts, failures with and without a
`retry_after_s`, a role, rate limits on two rows in three, a start reported for one in four, a
re-sent duplicate now and then; settled in reads of 1 to 5 frames) to a `wire()`d control of
this checkout and of each TREE (each in its own process, `PYTHONHASHSEED=0`, with that tree's
code first on the path), then compares, byte for byte: the ledger file, the `/metrics`
exposition, the event feed's replay (each event's seq, kind and payload; the epoch is random),
and the spend, routes and circuit views. Prints one line per output and exits 1 on a difference.
"""

from __future__ import annotations

import argparse
import asyncio
import filecmp
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

OUTPUTS = ("ledger", "metrics", "events", "views")
REPO = Path(__file__).resolve().parents[1]


def _frames() -> list[bytes]:
    import msgspec

    from shared.clock import iso_ms, now_ms
    from shared.rpc import encode_frame
    from shared.wire import AttemptFinished, AttemptRow, AttemptStarted, RateLimit, RateLimits, Usage

    stamp = iso_ms(now_ms() // 3_600_000 * 3_600_000 + 1234)
    variants: list[dict[str, Any]] = [
        {},
        {"usage": Usage(input_tokens=123457, output_tokens=98765, cache_read_tokens=5555, cache_creation_tokens=77)},
        {"served_model": "unknown-model-x", "usage": Usage(input_tokens=5)},
        {"usage": None},
        {
            "usage": None,
            "http_status": 429,
            "status": "upstream_error",
            "condition": "rate-limited",
            "retry_after_s": 3.0,
        },
        {"path": "/v1/messages/count_tokens", "usage": Usage(input_tokens=9)},
        {"status": "client_aborted", "http_status": None, "usage": None},
        {"status": "refused", "http_status": 503, "usage": None, "refusal_reason": "request-capacity-exhausted"},
        {"status": "upstream_error", "http_status": 529, "condition": "overloaded", "usage": None},
        {"worker_role": "reviewer", "usage": Usage(input_tokens=1, output_tokens=2)},
        {"overhead_ms": None, "duration_ms": None},
        {"overhead_ms": 12.5, "usage": Usage(input_tokens=2_000_000, output_tokens=1_000_000)},
    ]
    seen = RateLimit(limit=4000, remaining=3999, reset_at=stamp)
    limits = RateLimits(observed_at=stamp, requests=seen, tokens=RateLimit(limit=2_000_000, remaining=1_999_000))
    frames = []
    for n in range(600):
        fields: dict[str, Any] = {
            "attempt_id": f"att_{n:06d}",
            "key_id": f"key_{n % 7}",
            "account_id": "anthropic-default",
            "mint_decision_id": None,
            "dispatch_id": None,
            "repo_slug": "acme/widgets",
            "principal_id": "bench",
            "wire": "anthropic",
            "path": "/v1/messages",
            "requested_model": "claude-sonnet-4-5",
            "served_model": "claude-sonnet-4-5-20250929",
            "stream": False,
            "started_at": stamp,
            "finished_at": stamp,
            "status": "completed",
            "http_status": 200,
            "condition": None,
            "refusal_reason": None,
            "usage": Usage(input_tokens=12 + n, output_tokens=30 + 3 * n),
            "cost_usd": None,
            "cost_reason": None,
            "overhead_ms": 0.21 + n / 1000,
            "principal_kind": "user",
            "duration_ms": 3.9,
            "bytes_out": 512,
            "rate_limits": limits if n % 3 else None,
        }
        done = AttemptRow(**{**fields, **variants[n % len(variants)]})
        if n % 4 == 0:  # its start reported too
            start = msgspec.structs.replace(
                done, served_model=None, finished_at=None, status=None, http_status=None, condition=None, usage=None
            )
            frames.append(encode_frame(AttemptStarted(row=start)))
        frames.append(encode_frame(AttemptFinished(req_id=n + 1, row=done)))
        if n % 50 == 7:  # re-sent: a duplicate
            frames.append(encode_frame(AttemptFinished(req_id=n + 1000, row=done)))
    return frames


def wired(state: str) -> Any:
    """A `wire()`d control over the state directory `state`, as `controlplane.main` wires it, of
    the checkout first on the path (`bench.control_instructions` loads this file by its path)."""
    from controlplane.main import wire
    from controlplane.prices import load_prices
    from controlplane.registry import Registry
    from controlplane.stores.keys import KeyTable
    from controlplane.stores.ledger import Ledger
    from shared.settings import load_settings

    env = {"GATEWAY_STATE_DIR": state, "GATEWAY_RUNTIME_DIR": state, "GATEWAY_CONTROL_TOKEN": "bench-" + "x" * 30}
    settings = load_settings(env)
    keys = KeyTable(os.path.join(state, "keys.jsonl"))
    keys.load(0)
    ledger = Ledger(os.path.join(state, "ledger.jsonl"))
    ledger.open()
    return wire(settings, Registry.from_settings(settings), keys, ledger, load_prices(), env={"X": "x"})


async def _dump(out: Path) -> None:
    import msgspec
    from prometheus_client.exposition import generate_latest

    from bench.control_rows import _Conn
    from controlplane.core.spend import By
    from controlplane.core.spendscopes import TenancyMap
    from controlplane.core.windows import Window
    from controlplane.routebook import view_of
    from shared.clock import now_ms
    from shared.rpc import _HEADER, decode_body

    with tempfile.TemporaryDirectory() as state:
        control = wired(state)
        service, conn = control.service, _Conn()
        for n, frame in enumerate(_frames(), 1):
            service.handle(conn, decode_body(frame[_HEADER.size :]))  # type: ignore[arg-type]
            if n % (1 + n % 5) == 0:
                service.read_done()
                await asyncio.sleep(0)
        service.read_done()
        await service.settle()
        service.ledger.close()
        (out / "ledger").write_bytes(Path(state, "ledger.jsonl").read_bytes())
        (out / "metrics").write_bytes(generate_latest(control.metrics.registry))
        hub = service.events
        lines = [f"{e.seq} {e.kind} ".encode() + e.payload for e in hub.replay]
        (out / "events").write_bytes(b"\n".join([*lines, b"published %d" % hub.published]))
        tenancy, at = TenancyMap(team_of={}, org_of={}), now_ms()
        spend = {f"{w}/{b}": repr(control.spend.spend(w, b, tenancy, at)[1]) for w in Window for b in By}
        recent = service.routes.recent_view(10_000)
        circuits = sorted((a, msgspec.to_builtins(s)) for a, s in service.circuits.store._state.items())  # type: ignore[attr-defined]
        views = [spend, repr(msgspec.to_builtins([view_of(r) for r in recent[0]])), repr(recent[1:]), repr(circuits)]
        (out / "views").write_text(json.dumps(views, indent=1, sort_keys=True))
        service.keys.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", type=Path, help="other checkouts to compare with this one")
    parser.add_argument("--dump", type=Path, help=argparse.SUPPRESS)  # one checkout's outputs, here
    args = parser.parse_args(argv)
    if args.dump is not None:
        asyncio.run(_dump(args.dump))
        return 0
    from bench.procs import tree_python

    different = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, tree in [("this checkout", REPO), *((str(t), t.resolve()) for t in args.trees)]:
            out = Path(tmp, str(len(os.listdir(tmp))))
            out.mkdir()
            code = f"import runpy, sys; sys.path.insert(0, {str(tree)!r}); sys.argv = ['control_outputs', '--dump', {str(out)!r}]; runpy.run_path({__file__!r}, run_name='__main__')"
            python = sys.executable if tree == REPO else tree_python(tree)
            subprocess.run(
                [python, "-c", code], env={**os.environ, "PYTHONHASHSEED": "0"}, check=True, capture_output=True
            )
            if out.name == "0":
                continue
            for output in OUTPUTS:
                same = filecmp.cmp(Path(tmp, "0", output), out / output, shallow=False)
                different += not same
                print(f"  {output:8s} this checkout {'==' if same else '!='} {name}")
    return 1 if different else 0


if __name__ == "__main__":
    raise SystemExit(main())
