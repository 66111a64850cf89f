"""How a relayed exchange ended, and what that makes its terminal row (SPEC §7, §12). Pure.

The relay reports one `Ending` and whether the wire's terminal event was seen; `verdict` turns
that into the row's status, refusal and whether the worker's connection must be cut (ended
without the chunked terminator, so no client can take a truncated answer for a whole one).
`is_complete` is the SPEC §12 definition of a complete stream. No I/O here.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from shared.codes import AttemptStatus, Refusal

CHAT_PATH = "/v1/chat/completions"


class Ending(StrEnum):
    EOF = "eof"  # the upstream ended its body cleanly
    UPSTREAM_FAILED = "upstream-failed"  # read error or reset after the headers
    IDLE_TIMEOUT = "idle-timeout"  # silence between two chunks past the idle timeout
    CLIENT_GONE = "client-gone"  # the worker went away
    SHUTDOWN = "shutdown"  # the drain window ran out (SIGTERM)


class Verdict(msgspec.Struct, frozen=True):
    status: AttemptStatus
    refusal: Refusal | None
    cut: bool


_COMPLETED = Verdict(AttemptStatus.COMPLETED, None, cut=False)
_CUT = Verdict(AttemptStatus.TRANSPORT_ERROR, None, cut=True)
VERDICTS: dict[tuple[Ending, bool], Verdict] = {
    (Ending.EOF, True): _COMPLETED,
    (Ending.EOF, False): _CUT,
    (Ending.UPSTREAM_FAILED, True): _CUT,
    (Ending.UPSTREAM_FAILED, False): _CUT,
    (Ending.IDLE_TIMEOUT, True): _CUT,
    (Ending.IDLE_TIMEOUT, False): _CUT,
    (Ending.CLIENT_GONE, True): Verdict(AttemptStatus.CLIENT_ABORTED, None, cut=False),
    (Ending.CLIENT_GONE, False): Verdict(AttemptStatus.CLIENT_ABORTED, None, cut=False),
    (Ending.SHUTDOWN, True): Verdict(AttemptStatus.REFUSED, Refusal.GATEWAY_SHUTDOWN, cut=True),
    (Ending.SHUTDOWN, False): Verdict(AttemptStatus.REFUSED, Refusal.GATEWAY_SHUTDOWN, cut=True),
}


def verdict(ending: Ending, complete: bool) -> Verdict:
    """The terminal of a 2xx exchange whose headers were already relayed (a clean end, the
    usual one, without hashing an enum member: `Enum.__hash__` is a Python call)."""
    if ending is _EOF:
        return _COMPLETED if complete else _CUT
    return VERDICTS[(ending, complete)]


_EOF = Ending.EOF


def is_complete(path: str, is_sse: bool, readable: bool, terminal: bool, finish_seen: bool) -> bool:
    """SPEC §12: a stream is complete only when its wire's terminal event arrived.

    A non-SSE body is complete when it ended cleanly (its length is the transport's business).
    Chat completions also complete on a clean close after a `finish_reason` (some compatible
    providers omit `[DONE]`). A stream in an encoding the gateway cannot read (`readable`
    false) is judged by its clean close alone.
    """
    if not is_sse or not readable:
        return True
    return terminal or (finish_seen and path == CHAT_PATH)
