"""`scrub_spawn_env`: the environment a worker process may inherit (SPEC §13).

The whole `GATEWAY_*` namespace is removed: it holds the control token and every provider
credential variable. The worker gets its base URL and virtual key from the caller instead.
"""

from __future__ import annotations

from collections.abc import Mapping


def scrub_spawn_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith("GATEWAY_")}
