"""Instructions per row of control's row path, counted in one process by callgrind:
`python -m bench.control_instructions [--rows 2000] [--per-read 8] [--pieces] [TREE ...]`.

What `bench.control_rows` times, counted instead: a 2xx `AttemptFinished` frame with a provider's
full rate-limit set (its start withdrawn, as the data plane reports a short attempt) is decoded
and handled by a `wire()`d `ControlService`, `--per-read` frames per RPC read (each read settled
by `read_done`, as the link's reader does), after 200 rows of warm-up and `settle_heap()`.
The process runs under `valgrind --tool=callgrind --collect-atstart=no`; collection is switched
on and off around the counted loop by callgrind's client requests (a 3-line C helper, compiled
here with `cc` against `valgrind/callgrind.h` and loaded with ctypes), one dump per region.
`PYTHONHASHSEED=0` and ids from a counter: with a random seed or random ids the same tree's
count moves by ~1k per row between runs (dict and set probe lengths); so, it repeats exactly.
`--pieces` also counts the row path's parts alone, each over decoded (or priced) rows: the decode, `cost_of`, the ledger's `stage`, each row sink, the two
route events, evidence, the route book, and a one-row settle's circuit fold.
For this checkout and each TREE given (its code first on the path, run by its own `.venv` when it
has one), it prints thousands of instructions per row (per call for a piece).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import itertools
import os
import re
import runpy
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WARM = 200
_HELPER = """#include <valgrind/callgrind.h>
void cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
void cg_dump(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
"""
_TOTALS = re.compile(r"^totals:\s*(\d+)", re.M)
_NAME = re.compile(r"^desc: Trigger: Client Request: (\S+)", re.M)
_SERIAL = itertools.count(1)


def _finished_bodies(count: int) -> list[bytes]:
    import bench.control_rows
    from shared.rpc import _HEADER
    from shared.tokens import ulid

    # The same ids every run (random ones move the count by ~1k per row: dict probe lengths), new
    # ones every call (a row seen before would be a duplicate).
    bench.control_rows.new_ulid = lambda: ulid(1_764_547_200_000, next(_SERIAL).to_bytes(10, "big"))
    return [frame[_HEADER.size :] for frame in bench.control_rows._frames(count, rate_limits=True)[1::2]]


async def _count(helper: str, rows: int, per_read: int, pieces: bool) -> None:
    """The child, under callgrind: each region run over `WARM` rows, then counted over `rows`."""
    import msgspec

    from bench.control_rows import _Conn
    from controlplane.core.pricing import cost_of
    from controlplane.events import EventKind
    from shared.heap import settle_heap
    from shared.rpc import decode_body

    cg = ctypes.CDLL(helper)

    def region(name: str, run: Callable[[list[Any]], None], items: list[Any]) -> None:
        run(items[:WARM])
        cg.cg_toggle()
        run(items[WARM:])
        cg.cg_toggle()
        cg.cg_dump(name.encode())

    wired = runpy.run_path(str(Path(__file__).with_name("control_outputs.py")))["wired"]  # whatever tree is first
    with tempfile.TemporaryDirectory() as state:
        control = wired(state)
        service, conn, ledger = control.service, _Conn(), control.service.ledger
        settle_heap()

        def handled(bodies: list[bytes]) -> None:
            for n, body in enumerate(bodies, 1):
                service.handle(conn, decode_body(body))  # type: ignore[arg-type]
                if n % per_read == 0:
                    service.read_done()
            service.read_done()

        region("rows", handled, _finished_bodies(WARM + rows))
        if pieces:
            region("decode", lambda bodies: [decode_body(b) for b in bodies], _finished_bodies(WARM + rows))
            decoded = [decode_body(b).row for b in _finished_bodies(WARM + rows)]  # type: ignore[union-attr]
            price_of = service._price_of

            def priced(rows_: list[Any]) -> None:
                for r in rows_:
                    cost_of(price_of, r.served_model or r.requested_model, r.usage, r.path, r.http_status)

            region("cost_of", priced, decoded)
            done = [msgspec.structs.replace(r, cost_usd=0.0005, cost_reason="priced") for r in decoded]
            each: dict[str, Callable[[Any], object]] = {"ledger.stage": ledger.stage}
            each.update({f"sink:{getattr(s, '__qualname__', s)}": s for s in service.row_sinks})
            each["route events (2)"] = lambda r: (
                service.events.publish_row(EventKind.ROUTE_STARTED, r),
                service.events.publish_row(EventKind.ROUTE_FINISHED, r),
            )
            each["evidence.record"] = lambda r: service.evidence.record(r, 1_700_000_000_000)
            each["routes.finished"] = service.routes.finished
            each["circuits.fold_now (1 row)"] = lambda r: service.circuits.fold_now([r], 1_700_000_000_000)
            for name, call in each.items():
                region(name.replace(" ", "_"), lambda rows_, call=call: [call(r) for r in rows_], done)  # type: ignore[misc]
        await service.settle()
        ledger.close()
        service.keys.close()


def measure(tree: Path, helper: str, workdir: Path, args: argparse.Namespace) -> dict[str, float]:
    from bench.procs import tree_python

    out = workdir / "cg"
    child = (
        f"import runpy, sys; sys.path.insert(0, {str(tree)!r}); sys.argv = ['control_instructions', '--child', "
        f"{helper!r}, '--rows', '{args.rows}', '--per-read', '{args.per_read}'{', ' + repr('--pieces') if args.pieces else ''}]; "
        f"runpy.run_path({__file__!r}, run_name='__main__')"
    )
    python = sys.executable if tree == REPO else tree_python(tree)
    argv = ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--dump-instr=no", f"--callgrind-out-file={out}"]
    subprocess.run(
        [*argv, python, "-c", child], env={**os.environ, "PYTHONHASHSEED": "0"}, check=True, capture_output=True
    )
    counts = {}
    for path in sorted(workdir.glob("cg.*"), key=lambda p: int(p.suffix[1:])):
        text = path.read_text(errors="replace")
        name, total = _NAME.search(text), _TOTALS.search(text)
        if name and total:
            counts[name.group(1)] = int(total.group(1)) / args.rows
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", type=Path, help="other checkouts to count too")
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--per-read", type=int, default=8, help="frames per RPC read")
    parser.add_argument("--pieces", action="store_true", help="the row path's parts alone, too")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # the counted process: the helper's path
    args = parser.parse_args(argv)
    if args.child is not None:
        asyncio.run(_count(args.child, args.rows, args.per_read, args.pieces))
        return 0
    if shutil.which("valgrind") is None or shutil.which("cc") is None:
        print("bench.control_instructions: needs valgrind and a C compiler", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="leasehold-cir-") as tmp:
        source, helper = Path(tmp, "cg.c"), Path(tmp, "libcg.so")
        source.write_text(_HELPER)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(helper), str(source)], check=True)
        for name, tree in [("this checkout", REPO), *((str(t), t.resolve()) for t in args.trees)]:
            workdir = Path(tmp, f"run{len(os.listdir(tmp))}")
            workdir.mkdir()
            counts = measure(tree, str(helper), workdir, args)
            print(f"  {name}: " + "  ".join(f"{k} {v / 1e3:,.2f}k" for k, v in counts.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
