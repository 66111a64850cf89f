"""The data plane's redial policy (`dataplane.rpc_client.redial_wait`): a short fixed poll while
control is starting beside it, the capped jittered backoff once it has been linked (or after
the start window)."""

from __future__ import annotations

import pytest

from dataplane.rpc_client import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    STARTUP_FAST_S,
    STARTUP_POLL_S,
    redial_wait,
)


@pytest.mark.parametrize(
    ("delay", "linked", "since_start_s", "jitter", "expected"),
    [
        # never linked, young: poll, and the backoff does not grow meanwhile
        (BACKOFF_MIN_S, False, 0.0, 0.9, (STARTUP_POLL_S, BACKOFF_MIN_S)),
        (BACKOFF_MIN_S, False, STARTUP_FAST_S - 0.001, 0.0, (STARTUP_POLL_S, BACKOFF_MIN_S)),
        # never linked, past the start window: the backoff
        (BACKOFF_MIN_S, False, STARTUP_FAST_S, 0.0, (BACKOFF_MIN_S * 0.5, BACKOFF_MIN_S * 2)),
        # linked once (control restarting): the backoff at once, doubling up to its cap
        (0.4, True, 0.5, 0.5, (0.4, 0.8)),
        (BACKOFF_MAX_S, True, 100.0, 0.0, (BACKOFF_MAX_S * 0.5, BACKOFF_MAX_S)),
    ],
)
def test_redial_wait(
    delay: float, linked: bool, since_start_s: float, jitter: float, expected: tuple[float, float]
) -> None:
    assert redial_wait(delay, linked, since_start_s, jitter) == pytest.approx(expected)
