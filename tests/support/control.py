"""A control daemon's collaborators under test, wired by the daemon's own `wire`.

Every in-process test of the control side builds its service, desk and stores here, so a test
exercises the same wiring `leasehold-control` runs (only the listeners are left out).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from controlplane.core.pricing import PriceTable
from controlplane.prices import load_prices
from controlplane.registry import Registry
from controlplane.stores.keys import KeyTable
from controlplane.stores.ledger import Ledger
from controlplane.wiring import Control, wire
from shared.clock import now_ms
from shared.settings import load_settings

TOKEN = "t" * 32


def make_control(
    state_dir: Path,
    *,
    settings: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    registry: Registry | None = None,
    prices: PriceTable | None = None,
    keys_journal: bool = True,
    ledger: Ledger | None = None,
) -> Control:
    """`settings` are GATEWAY_* values over a minimal set (token, state and runtime dirs);
    `env` is the environment the service reads credentials from; `ledger` an opened one (on a
    test's clock) instead of a fresh one in `state_dir`."""
    state_dir.mkdir(parents=True, exist_ok=True)
    loaded = load_settings(
        {
            "GATEWAY_CONTROL_TOKEN": TOKEN,
            "GATEWAY_STATE_DIR": str(state_dir),
            "GATEWAY_RUNTIME_DIR": str(state_dir),
            **(settings or {}),
        }
    )
    keys = KeyTable(str(state_dir / "keys.jsonl") if keys_journal else None)
    keys.load(now_ms())
    if ledger is None:
        ledger = Ledger(str(state_dir / "ledger.jsonl"))
        ledger.open()
    return wire(
        loaded,
        registry or Registry.from_settings(loaded),
        keys,
        ledger,
        load_prices() if prices is None else prices,
        env=dict(env or {}),
    )


def close_control(control: Control) -> None:
    control.service.ledger.close()
    control.service.keys.close()
