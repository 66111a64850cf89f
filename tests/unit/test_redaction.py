"""The redactor: by shape and by registered value, nested values and exceptions included."""

from __future__ import annotations

import io
import json

import pytest
import structlog

from shared.logging import configure_logging, get_logger, redact_text, register_secret

SECRETS = [
    "sk-ant-api03-" + "A1b2C3d4" * 10,
    "sk-proj-" + "Z9y8X7w6" * 6,
    "lhgw_01J0000000000000000000000A.dGhpcyBpcyBhIHNlY3JldCBoYWxmIG9mIGEgdG9rZW4x",
]


@pytest.mark.parametrize("secret", SECRETS, ids=["anthropic", "openai", "virtual-key"])
def test_shapes_are_redacted(secret: str) -> None:
    assert secret not in redact_text(f"calling with {secret} now")
    assert secret.split(".")[-1] not in redact_text(f"x {secret}")


@pytest.mark.parametrize(
    "text",
    [
        "Authorization: Bearer abcdefgh12345678",
        "x-api-key: q1w2e3r4t5y6u7",
        "https://h/p?api_key=zzzzzzzzzzzzzz",
        '{"token": "abcdefghijklmnop"}',
    ],
)
def test_labelled_values_are_redacted(text: str) -> None:
    assert "[redacted]" in redact_text(text)


def test_registered_values_are_redacted_whatever_their_shape() -> None:
    register_secret("plain-looking-control-value-42")
    assert "plain-looking-control-value-42" not in redact_text("token was plain-looking-control-value-42!")


def test_ordinary_text_is_untouched() -> None:
    for text in ["model claude-sonnet-4-6", "key_id 01J0000000000000000000000A", "input_tokens=12"]:
        assert redact_text(text) == text


def test_log_lines_nested_values_and_exceptions_are_scrubbed() -> None:
    out = io.StringIO()
    secret = "value-only-secret-" + "q" * 20
    configure_logging("test", "debug", stream=out, secrets=[secret])
    log = get_logger("t")
    log.info("event_with_secret", nested={"deep": [f"Bearer {secret}"]}, url=f"http://x/?k={secret}")
    try:
        raise RuntimeError(f"upstream said {SECRETS[0]}")
    except RuntimeError:
        log.exception("failed")
    text = out.getvalue()
    structlog.reset_defaults()
    assert secret not in text and SECRETS[0] not in text
    lines = [json.loads(line) for line in text.splitlines()]
    assert [line["event"] for line in lines] == ["event_with_secret", "failed"]
