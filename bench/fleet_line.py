"""The data plane's reserve round trip in-process (issue 27): redis-py's pool vs the script line.

`python -m bench.fleet_line [--rounds 6] [--each 300] [--gap-ms 3]` starts one redis-server on
loopback and times `RedisCapacity.reserve` (with the previous holder's release riding along, as
the data plane sends it) through redis-py's pooled client and through `ScriptLine`, the two
interleaved in rounds, with `--gap-ms` idle between reserves (a sequential worker's pace: the
process and Redis fall idle between requests, as they do from outside). Prints p50/p90 per path
and the per-round p50 ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from shared.fleet.capacity import RedisCapacity
from shared.fleet.keys import Ceiling, FleetKeys
from shared.fleet.redis_client import connect
from shared.fleet.scriptline import ScriptLine
from tests.support.redis_server import RedisServer


async def _timed(capacity: RedisCapacity, each: int, gap_s: float, tag: str) -> list[float]:
    samples, previous = [], ()
    for n in range(each):
        holder = f"{tag}-{n}"
        started = time.perf_counter()
        assert await capacity.reserve("bench", holder, 64, previous)
        samples.append((time.perf_counter() - started) * 1000)
        previous = (holder,)
        await asyncio.sleep(gap_s)
    await capacity.release_all(previous)
    return samples


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))], 3)


async def measure(url: str, rounds: int, each: int, gap_s: float) -> dict[str, object]:
    client = connect(url)
    line = ScriptLine.of(client)
    keys = FleetKeys("bench-line")
    paths = {
        "pool": RedisCapacity(client, keys, Ceiling.REQUEST, "h"),
        "line": RedisCapacity(client, keys, Ceiling.REQUEST, "h", line=line),
    }
    samples: dict[str, list[float]] = {name: [] for name in paths}
    ratios = []
    try:
        for index in range(rounds + 1):  # the first round warms both up, dropped
            got = {name: await _timed(capacity, each, gap_s, f"{name}-{index}") for name, capacity in paths.items()}
            if index:
                for name, values in got.items():
                    samples[name] += values
                ratios.append(round(_pct(got["line"], 0.5) / _pct(got["pool"], 0.5), 3))
    finally:
        line.close()
        await client.aclose()
    out: dict[str, object] = {name: {"p50_ms": _pct(v, 0.5), "p90_ms": _pct(v, 0.9)} for name, v in samples.items()}
    out["line_over_pool_p50_per_round"] = ratios
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--each", type=int, default=300)
    parser.add_argument("--gap-ms", type=float, default=3.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-line-") as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        try:
            import uvloop  # the data plane's loop

            result = uvloop.run(measure(server.url, args.rounds, args.each, args.gap_ms / 1000))
        finally:
            server.stop()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
