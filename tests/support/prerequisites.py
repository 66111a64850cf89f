"""What the system tests need from the machine and do not install themselves: Debian's chromium
(the dashboard tests) and the Claude Code and Codex CLIs from npm (the real-client tests).

`make test` prepares them before pytest starts (the Makefile's `chromium` and `test-clients`
targets). A test that finds one missing skips, naming the command that installs it; under CI
(`CI` set, as `.ci/run` does) it fails instead, so no suite silently drops them.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_INSTALL = "apt-get install -y chromium   (or, as root: make chromium)"
CLIENTS_INSTALL = "make test-clients   (npm install --prefix {cache} @anthropic-ai/claude-code @openai/codex)"


def in_ci(env: dict[str, str] | None = None) -> bool:
    """CI as CI services spell it: `CI` set to anything but empty, 0, false or no."""
    value = (os.environ if env is None else env).get("CI", "")
    return value.strip().lower() not in ("", "0", "false", "no")


def missing(what: str, install: str) -> NoReturn:
    """A prerequisite is absent: a failure under CI, otherwise a skip that says how to install it."""
    message = f"{what} is missing; install it with: {install}"
    if in_ci():
        pytest.fail(f"{message} (CI must provide it: `make test` prepares it as root)", pytrace=False)
    pytest.skip(message)
