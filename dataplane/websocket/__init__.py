"""The Responses API over WebSocket (SPEC §20): Codex's first transport, with every lease rule.

`events` (pure: what a frame is, what an error event stands for), `handshake` (auth and gates
before the upgrade, the upstream socket), `session` (one proxied socket: the relay and its
attempts), `sockets` (the open sockets: rights sweeps, drain, counts).
"""
