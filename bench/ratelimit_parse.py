"""The rate-limit header parser's cost on the hot path (SPEC §22): `python -m bench.ratelimit_parse`.

Times `dataplane.ratelimits.rate_limits_of` on the headers a real answer carries, as the data
plane holds them (a `CIMultiDictProxy`, what aiohttp's response parser builds): an answer without
any rate-limit header (a provider that sends none), a full Anthropic set (12 headers) and a full OpenAI set (6). Each figure is the fastest of
`ROUNDS` rounds of `NUMBER` calls (the least disturbed by other processes),
in nanoseconds of this process's CPU time per call (`time.process_time`: the time other
processes hold the core is not counted, so a loaded machine inflates it far less than a wall
clock), on one core; a few seconds in all. For scale, the same run times one
`dataplane.stamps.new_ulid()`, of which the data plane makes one per request (the attempt id).
"""

from __future__ import annotations

import argparse
import time
import timeit

from multidict import CIMultiDict, CIMultiDictProxy

from dataplane.ratelimits import rate_limits_of
from dataplane.stamps import new_ulid
from dataplane.wires.table import WIRES
from shared.clock import now_ms

ROUNDS = 7
NUMBER = 20_000

COMMON = {
    "date": "Tue, 01 Dec 2026 21:00:00 GMT",
    "content-type": "application/json",
    "content-length": "512",
    "connection": "keep-alive",
    "request-id": "req_011CUxyz",
    "x-request-id": "req_abc",
    "cf-ray": "8f00-LHR",
    "server": "cloudflare",
    "anthropic-organization-id": "org-uuid",
    "via": "1.1 google",
    "cf-cache-status": "DYNAMIC",
    "x-envoy-upstream-service-time": "412",
    "strict-transport-security": "max-age=31536000",
}
ANTHROPIC = {
    f"anthropic-ratelimit-{kind}-{part}": value
    for kind in ("requests", "tokens", "input-tokens", "output-tokens")
    for part, value in (("limit", "4000"), ("remaining", "3999"), ("reset", "2026-12-01T21:01:00Z"))
}
OPENAI = {
    "x-ratelimit-limit-requests": "10000",
    "x-ratelimit-remaining-requests": "9999",
    "x-ratelimit-reset-requests": "6ms",
    "x-ratelimit-limit-tokens": "30000000",
    "x-ratelimit-remaining-tokens": "29999000",
    "x-ratelimit-reset-tokens": "2m0.5s",
}

CASES = (
    ("no rate-limit header (anthropic wire)", "anthropic", COMMON),
    ("no rate-limit header (openai wire)", "openai", COMMON),
    ("anthropic, every kind", "anthropic", {**COMMON, **ANTHROPIC}),
    ("openai, both kinds", "openai", {**COMMON, **OPENAI}),
)


def per_call_ns(wire: str, pairs: dict[str, str], rounds: int, number: int) -> float:
    headers = CIMultiDictProxy(CIMultiDict(pairs))
    names = WIRES[wire].rate_limits
    timer = timeit.Timer(lambda: rate_limits_of(headers, names, now_ms), timer=time.process_time)
    return min(timer.repeat(rounds, number)) / number * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--number", type=int, default=NUMBER)
    args = parser.parse_args()
    ulid = min(timeit.Timer(new_ulid, timer=time.process_time).repeat(args.rounds, args.number)) / args.number * 1e9
    print(f"{'headers':<42} {'ns/call':>9}")
    print(f"{'(for scale: one new_ulid())':<42} {ulid:>9.0f}")
    empty = per_call_ns("anthropic", {}, args.rounds, args.number)
    print(f"{'(an empty mapping: the call itself)':<42} {empty:>9.0f}")
    for name, wire, pairs in CASES:
        print(f"{name:<42} {per_call_ns(wire, pairs, args.rounds, args.number):>9.0f}")


if __name__ == "__main__":
    main()
