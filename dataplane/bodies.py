"""Strict request bodies (SPEC §19): one JSON object, at most one string `model`. Pure.

A minimal stand-in with the API the strict-bodies work provides (`BodyRefused`, `strict_model`);
the socket relay (dataplane/websocket) holds each client message to it.
"""

from __future__ import annotations

import json
from typing import Any

from shared.codes import Refusal


class BodyRefused(Exception):
    """A body the gateway cannot read; `code` is the refusal (`invalid-request-body`)."""

    def __init__(self, code: Refusal, message: str) -> None:
        super().__init__(message)
        self.code = code


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if sum(1 for key, _ in pairs if key == "model") > 1:
        raise ValueError("more than one model member")
    return dict(pairs)


def strict_model(body: bytes) -> str | None:
    """The body's `model` (None when it names none), or `BodyRefused`."""
    try:
        if body.startswith(b"\xef\xbb\xbf"):
            raise ValueError("a byte order mark")
        text = body.decode("utf-8")
        parsed = json.loads(text, parse_constant=_no_constants, object_pairs_hook=_pairs)
        text.encode("utf-8")  # an unpaired surrogate escape does not encode
        if any(0xD800 <= ord(ch) <= 0xDFFF for ch in _strings(parsed)):
            raise ValueError("an unpaired surrogate")
    except (UnicodeError, ValueError, RecursionError) as exc:
        raise BodyRefused(Refusal.INVALID_REQUEST_BODY, f"the body is not one strict JSON object "
                          f"({str(exc)[:80]})") from None
    if not isinstance(parsed, dict):
        raise BodyRefused(Refusal.INVALID_REQUEST_BODY, "the body is not a JSON object")
    model = parsed.get("model")
    if model is not None and not isinstance(model, str):
        raise BodyRefused(Refusal.INVALID_REQUEST_BODY, "the body's model is not a string")
    return model


def _strings(value: Any) -> str:
    """Every string of a small decoded value, joined (for the surrogate check)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return "".join(k + _strings(v) for k, v in value.items())
    if isinstance(value, list):
        return "".join(_strings(v) for v in value)
    return ""
