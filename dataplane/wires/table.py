"""The wires the data plane speaks, as a table: `WIRES` (a wire's string → its `WireSpec`) and
`guess_wire`, the wire a request is answered in before a lease says which.

Adding a wire: its `Wire` member and `WireFacts` (`shared/wires.py`), one module here that
builds its `WIRE`, and a line below; `tests/unit/test_wire_table.py` enumerates this table.
"""

from __future__ import annotations

from collections.abc import Mapping

from multidict import CIMultiDictProxy

from dataplane.wires import anthropic, openai
from dataplane.wires.spec import WireSpec
from shared.wires import DEFAULT_WIRE

WIRES: Mapping[str, WireSpec] = {spec.name: spec for spec in (anthropic.WIRE, openai.WIRE)}
DEFAULT = WIRES[DEFAULT_WIRE]
# The 426 answer to an upgrade no wire proxies (SPEC §20): where the WebSocket is served.
NOT_PROXIED = (
    "WebSocket is proxied only on "
    + " or ".join(
        f"GET {spec.websocket_path} of an {spec.facts.title}-wire lease"
        for spec in WIRES.values()
        if spec.websocket_path is not None
    )
    + "; use HTTP"
)

# A path only one wire serves names that wire (`/v1/models`, served by several, names none).
_OWNER: dict[str, WireSpec] = {
    path: spec
    for spec in WIRES.values()
    for path in spec.paths
    if sum(path in other.paths for other in WIRES.values()) == 1
}


def guess_wire(path: str, headers: CIMultiDictProxy[str]) -> WireSpec:
    """The wire to answer in before a lease says which (unknown or refused key): the path's,
    else the first whose tell-tale headers the request carries, else `DEFAULT`."""
    owner = _OWNER.get(path)
    if owner is not None:
        return owner
    for spec in WIRES.values():
        if any(name in headers for name in spec.facts.sniff_headers):
            return spec
    return DEFAULT
