"""An embedded daemon never loads what only fleet mode uses (issue 27: start-up and idle memory).

Importing the Redis client (with the OpenTelemetry API it pulls in) and fleet mode's modules cost
control ~9 MiB of idle RSS and ~130 modules at every start. They are imported only when
`GATEWAY_FLEET_REDIS_URL` is set (`controlplane.main.backends_for`, the data plane's admission
set-up). Each check runs in a fresh interpreter, so what an earlier test imported cannot hide a
regression.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.harness import REPO

# Top-level packages and project modules an embedded daemon must not import.
FLEET_ONLY = ("redis", "opentelemetry", "shared.fleet", "controlplane.fleet.wiring",
              "controlplane.fleet.host", "controlplane.fleet.view", "controlplane.fleet.spend",
              "dataplane.admission")


def loaded_after(*modules: str) -> set[str]:
    """The module names a fresh interpreter holds after importing `modules`."""
    code = ("import json, sys\n" + "".join(f"import {m}\n" for m in modules)
            + "print(json.dumps(sorted(sys.modules)))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OTEL_"))}
    done = subprocess.run([sys.executable, "-c", code], cwd=str(REPO), env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    return set(json.loads(done.stdout))


def fleet_only(loaded: set[str]) -> list[str]:
    return sorted(m for m in loaded if any(m == f or m.startswith(f + ".") for f in FLEET_ONLY))


@pytest.mark.parametrize("main", ["controlplane.main", "dataplane.main"])
def test_an_embedded_daemons_main_module_imports_nothing_fleet_only(main: str) -> None:
    assert fleet_only(loaded_after(main)) == []


def test_the_check_sees_a_fleet_import() -> None:
    """The check itself can fail: fleet mode's wiring does load the Redis client."""
    loaded = fleet_only(loaded_after("controlplane.fleet.wiring"))
    assert "redis" in loaded and "controlplane.fleet.wiring" in loaded
