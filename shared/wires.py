"""What each wire is, as data both daemons and `leaseholdctl` read (SPEC §4, §12, §15, §20).

One `WireFacts` per `Wire` member, in `FACTS`: the paths it serves, which of them name a model
(and in which body field) or report usage, its request id header, how its workers present a
key, the headers that say a keyless request speaks it, the base URL and environment a worker is
given, and where (if anywhere) it serves the Responses WebSocket.

Nothing outside this table and `dataplane/wires/` branches on a wire: the control plane and the
CLI read these facts; the data plane's behaviour per wire (error shape, stream scanner, usage,
cut event, rate-limit headers) is `dataplane/wires/`, one module per wire built on these facts
(the control plane must not import the data plane, so the pure half lives here).
`tests/unit/test_wire_table.py` checks that no other module compares against a wire.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from shared.codes import AuthStyle, Wire


class WireFacts(msgspec.Struct, frozen=True, kw_only=True):
    wire: Wire
    title: str  # its name in a sentence ("an OpenAI-wire lease")
    paths: frozenset[str]  # every other path is `path-not-served` (SPEC §12)
    model_paths: frozenset[str]  # a body here names its model; read strictly (SPEC §19)
    model_field: str  # the top-level body member that names the model
    usage_paths: frozenset[str]  # a JSON (non-SSE) answer here carries usage
    request_id_header: str  # the response header that carries a request id
    auth_styles: tuple[AuthStyle, ...]  # how its workers present a key (`Proxy.authenticate`)
    sniff_headers: tuple[str, ...]  # request headers that say a keyless request speaks it
    base_path: str  # appended to the data plane's URL for a worker
    worker_env: tuple[str, str]  # (base URL, key) variables its workers read
    websocket_path: str | None = None  # the Responses WebSocket (SPEC §20); None: 426 only
    codex: bool = False  # Codex's built-in provider speaks it (`leaseholdctl exec`)


ANTHROPIC = WireFacts(
    wire=Wire.ANTHROPIC,
    title="Anthropic",
    paths=frozenset({"/v1/messages", "/v1/messages/count_tokens", "/v1/models"}),
    model_paths=frozenset({"/v1/messages", "/v1/messages/count_tokens"}),
    model_field="model",
    usage_paths=frozenset({"/v1/messages"}),
    request_id_header="request-id",
    auth_styles=(AuthStyle.X_API_KEY, AuthStyle.BEARER),
    sniff_headers=("anthropic-version", "x-api-key"),
    base_path="",
    worker_env=("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"),
)

OPENAI = WireFacts(
    wire=Wire.OPENAI,
    title="OpenAI",
    paths=frozenset({"/v1/chat/completions", "/v1/responses", "/v1/embeddings", "/v1/models"}),
    model_paths=frozenset({"/v1/chat/completions", "/v1/responses", "/v1/embeddings"}),
    model_field="model",
    usage_paths=frozenset({"/v1/chat/completions", "/v1/responses", "/v1/embeddings"}),
    request_id_header="x-request-id",
    auth_styles=(AuthStyle.BEARER,),
    sniff_headers=(),
    base_path="/v1",
    worker_env=("OPENAI_BASE_URL", "OPENAI_API_KEY"),
    websocket_path="/v1/responses",
    codex=True,
)

# Every wire, keyed by its string (an `AccountRoute.wire`, a row's `wire`); a `Wire` member is
# its own string, so either looks it up.
FACTS: Mapping[str, WireFacts] = {str(facts.wire): facts for facts in (ANTHROPIC, OPENAI)}
# The wire a keyless request is answered in when neither its path nor its headers say.
DEFAULT_WIRE = Wire.OPENAI
