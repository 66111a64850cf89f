"""`python -m dataplane.probe`: wait until the data plane is synchronised with control.

The readiness check of `leasehold-dataplane.service` (`ExecStartPost=`), and a probe for any
supervisor: polls `GET /healthz` on `GATEWAY_DATAPLANE_LISTEN` (default `127.0.0.1:8788`; an
every-interface bind is probed on loopback) until it answers 200, and exits 0; exits 1 when
`--timeout` passes first, with the last answer on stderr; 2 for a malformed listen address.
Standard library only, so it costs a fraction of the daemon's own start. No proxy is used.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

from shared.listen import url_of_listen

LISTEN_VAR = "GATEWAY_DATAPLANE_LISTEN"
DEFAULT_LISTEN = "127.0.0.1:8788"
POLL_S = 0.1
ATTEMPT_TIMEOUT_S = 2.0


def healthz_url(env: Mapping[str, str]) -> str:
    return url_of_listen(env.get(LISTEN_VAR, "").strip() or DEFAULT_LISTEN) + "/healthz"


def check(opener: urllib.request.OpenerDirector, url: str) -> tuple[bool, str]:
    """One look: (synchronised, what was seen)."""
    try:
        with opener.open(url, timeout=ATTEMPT_TIMEOUT_S) as response:
            return response.status == 200, f"{response.status} {response.read(512).decode(errors='replace')}"
    except urllib.error.HTTPError as err:
        return False, f"{err.code} {err.read(512).decode(errors='replace')}"
    except (urllib.error.URLError, OSError) as exc:
        return False, str(getattr(exc, "reason", exc))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dataplane.probe", description=__doc__.split("\n")[0])
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait (default 60)")
    args = parser.parse_args(argv)
    try:
        url = healthz_url(os.environ)
    except ValueError as exc:
        print(f"leasehold-dataplane probe: {LISTEN_VAR}: {exc}", file=sys.stderr)
        return 2
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + args.timeout
    while True:
        ready, seen = check(opener, url)
        if ready:
            return 0
        if time.monotonic() >= deadline:
            print(
                f"leasehold-dataplane probe: {url} not synchronised within {args.timeout:g}s; last answer: {seen}",
                file=sys.stderr,
            )
            return 1
        time.sleep(POLL_S)


if __name__ == "__main__":
    sys.exit(main())
