"""`WireSpec`: one wire as the data plane speaks it — its facts (`shared/wires.py`) and its
behaviour (`dataplane/wires/anthropic.py`, `openai.py`), one value per wire in `table.WIRES`.

A request resolves its wire's spec once (`Attempt.spec`); everything after is attribute access
on it, so no hot-path code compares against a wire. The facts most read per request are copied
onto the spec, one attribute hop from the attempt.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dataplane.ratelimits import RateLimitHeaders
from dataplane.wires.sse import SseScanner
from shared.wire import Usage
from shared.wires import WireFacts


@dataclass(frozen=True, slots=True, eq=False)
class WireSpec:
    facts: WireFacts
    error_body: Callable[[int, str, str, str], bytes]  # (status, code, message, request id)
    cut_event: Callable[[str, str], bytes]  # (path, message): ends a cut SSE stream
    scanner: Callable[[str], SseScanner]  # a fresh SSE scanner for a path
    usage_from_body: Callable[[bytes], tuple[str | None, Usage | None]]  # a JSON answer's
    rate_limits: RateLimitHeaders  # its provider's rate-limit headers
    # copied from `facts` by `__post_init__`
    name: str = field(init=False)  # the `wire` of its rows
    paths: frozenset[str] = field(init=False)
    model_paths: frozenset[str] = field(init=False)
    usage_paths: frozenset[str] = field(init=False)
    request_id_header: str = field(init=False)
    websocket_path: str | None = field(init=False)

    def __post_init__(self) -> None:
        facts = self.facts
        for name, value in (
            ("name", str(facts.wire)),
            ("paths", facts.paths),
            ("model_paths", facts.model_paths),
            ("usage_paths", facts.usage_paths),
            ("request_id_header", facts.request_id_header),
            ("websocket_path", facts.websocket_path),
        ):
            object.__setattr__(self, name, value)
