"""A daemon's listen address (`HOST:PORT`, `[v6]:PORT`) → the URL that reaches it. Pure.

Parsed as `shared.settings` parses `GATEWAY_*_LISTEN`; an every-interface bind (`0.0.0.0`,
`[::]`) is reached on loopback. Used by `leaseholdctl` (SPEC §1: `http://$GATEWAY_CONTROL_LISTEN`)
and by the data plane's readiness probe.
"""

from __future__ import annotations

_LOOPBACK_OF = {"0.0.0.0": "127.0.0.1", "::": "::1"}


def url_of_listen(listen: str) -> str:
    """`http://HOST:PORT` for a listen address; ValueError when it is not `HOST:PORT`."""
    host, sep, port = listen.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"{listen!r} is not HOST:PORT")
    host = _LOOPBACK_OF.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
