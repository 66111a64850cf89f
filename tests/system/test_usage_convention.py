"""The usage convention of a ledger row (SPEC §14), on both OpenAI endpoints, JSON and stream,
end to end through the real openai SDK: `input_tokens` counts only the prompt tokens neither
read from nor written to a cache — `prompt_tokens − cached_tokens` on the OpenAI wire — so
`input + cache_read + cache_creation` is the whole prompt the SDK was told about, and cost is
the sum of each kind times its price. The stub reports cached tokens as the real API does (a
part of the prompt tokens)."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.core.pricing import price_for
from controlplane.prices import load_prices
from tests.support.attempts import MESSAGES, O_MODEL, openai_sdk, settled
from tests.support.harness import Gateway, Stub
from tests.support.stub_upstream import STUB_OPENAI_CACHED_TOKENS


def _chat_json(sdk) -> tuple[int, int, int]:
    usage = sdk.chat.completions.create(model=O_MODEL, messages=MESSAGES).usage
    return usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens, usage.completion_tokens


def _chat_stream(sdk) -> tuple[int, int, int]:
    chunks = list(
        sdk.chat.completions.create(
            model=O_MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
    )
    usage = chunks[-1].usage
    return usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens, usage.completion_tokens


def _responses_json(sdk) -> tuple[int, int, int]:
    usage = sdk.responses.create(model=O_MODEL, input="hi").usage
    return usage.input_tokens, usage.input_tokens_details.cached_tokens, usage.output_tokens


def _responses_stream(sdk) -> tuple[int, int, int]:
    with sdk.responses.stream(model=O_MODEL, input="hi") as stream:
        usage = stream.get_final_response().usage
    return usage.input_tokens, usage.input_tokens_details.cached_tokens, usage.output_tokens


CALLS = {
    "chat-json": (_chat_json, "/v1/chat/completions", False),
    "chat-stream": (_chat_stream, "/v1/chat/completions", True),
    "responses-json": (_responses_json, "/v1/responses", False),
    "responses-stream": (_responses_stream, "/v1/responses", True),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_openai_input_tokens_exclude_the_cached_part_of_the_prompt(
    gateway: Gateway, clean_stub: Stub, name: str
) -> None:
    call, path, stream = CALLS[name]
    minted = gateway.mint("openai")
    prompt, cached, output = call(openai_sdk(gateway, minted["token"]))
    assert cached == STUB_OPENAI_CACHED_TOKENS > 0  # the upstream reported a cache read

    row: dict[str, Any] = settled(gateway, minted["key_id"])[0]
    assert (row["path"], row["stream"], row["status"]) == (path, stream, "completed")
    usage = row["usage"]
    assert usage == {
        "input_tokens": prompt - cached,
        "cache_read_tokens": cached,
        "cache_creation_tokens": 0,
        "output_tokens": output,
    }
    assert usage["input_tokens"] + usage["cache_read_tokens"] + usage["cache_creation_tokens"] == prompt
    price = price_for(load_prices(), O_MODEL)  # the shipped table control prices rows with
    each_kind = (
        usage["input_tokens"] * price.input
        + usage["cache_read_tokens"] * price.cache_read
        + usage["cache_creation_tokens"] * price.cache_creation
        + usage["output_tokens"] * price.output
    )
    assert row["cost_reason"] == "priced" and row["cost_usd"] == pytest.approx(each_kind / 1e6, abs=1e-8)
    assert price.cache_read < price.input  # so counting the cached part as input would overbill
