"""The process harness itself: a daemon that dies while starting is reported at once, with its
exit status and its own words — never as a slow start that missed a deadline — and the ports
it picks cannot be taken meanwhile by an outgoing connection."""

from __future__ import annotations

import socket
import time

import pytest

from tests.support.harness import ProcessExited, ephemeral_range, free_port


def test_a_data_plane_that_cannot_start_is_reported_at_once(make_gateway) -> None:
    gw = make_gateway()
    with socket.socket() as taken:  # its port is in use: the daemon exits 2, naming the variable
        taken.bind(("127.0.0.1", gw.dataplane_port))
        taken.listen()
        started = time.monotonic()
        with pytest.raises(ProcessExited) as caught:
            gw.start()
        waited_s = time.monotonic() - started
    assert waited_s < 10, waited_s  # not the 20 s synchronisation deadline
    message = str(caught.value)
    assert "data plane exited with status 2" in message and "GATEWAY_DATAPLANE_LISTEN" in message, message


def test_ports_are_picked_below_the_ephemeral_range_and_free() -> None:
    low, _high = ephemeral_range()
    for _ in range(20):
        port = free_port()
        assert 1024 < port < low, port  # no connect() auto-binds there (nor leaves a TIME_WAIT)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))


def test_a_port_is_never_handed_out_twice() -> None:
    """A gateway picks both its ports before either daemon binds: the same pick twice made one
    daemon exit EADDRINUSE in CI (stop 29). Among 2,000 picks from ~12,000 ports a repeat is
    certain unless the harness remembers what it handed out."""
    picks = [free_port() for _ in range(2000)]
    assert len(set(picks)) == len(picks)
