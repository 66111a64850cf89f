"""Every bound and deadline of the server, in one frozen value (none looser than aiohttp's).

Request line and each header field: 8190 bytes, aiohttp's defaults (`max_line_size`,
`max_field_size`); header count: 128 (`max_headers`). aiohttp bounds no total head size and no
time: here a head is at most `max_head_bytes` and must arrive within `head_timeout_s` of its first
byte (slowloris), and a body the handler waits on must not stall longer than `body_timeout_s`
between two reads. The body's size bound is the app's (`Application.client_max_size`).
`max_connections` (0: none) caps the connections open at once: one more is sent the server's
`over_cap` answer and closed before anything of it is read. `head_from_open` starts the first
head's clock when the connection opens, not at its first byte (a connection that never sends is
closed at the head deadline; the data plane's SPEC §19).
"""

from __future__ import annotations

import msgspec


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    max_line_bytes: int = 8190  # the request line (method, target, version)
    max_field_bytes: int = 8190  # one header's name, and one header's value
    max_headers: int = 128
    max_head_bytes: int = 64 * 1024  # the whole head; every field at its bound cannot all fit
    head_timeout_s: float = 15.0  # first byte of a request to the end of its head
    body_timeout_s: float = 30.0  # a body read waiting for its next bytes
    keepalive_s: float = 75.0  # an idle connection between requests (aiohttp's classic 75 s)
    lingering_s: float = 5.0  # discarding a body the handler did not read before reusing/closing
    lingering_bytes: int = 8 * 1024 * 1024  # ... and at most this many bytes of it
    body_buffer_bytes: int = 256 * 1024  # buffered ahead of the handler's read: reading pauses past it
    max_pipelined: int = 16  # requests parsed ahead of the one being answered: reading pauses past it
    shutdown_grace_s: float = 10.0  # open requests finish within it on shutdown, then are cut
    max_connections: int = 0  # open at once; 0: no cap
    head_from_open: bool = False  # the first head's clock runs from the connection's opening


DEFAULT_LIMITS = Limits()
