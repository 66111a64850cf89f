"""What a lease may reach (SPEC §12): only the models its account serves (its `models` globs).

Two declared accounts point at the stub: `anthropic-haiku` (models `claude-haiku-*`) and
`openai-mini` (models `gpt-5-mini`); a platform policy orders them first so a v2 mint lands
on them. A request naming a model its lease's account does not serve is refused 400
`model-not-permitted` in the wire's `invalid_request_error` shape with `x-should-retry: false`,
makes no upstream call, and leaves one `refused` row that is never evidence (no circuit,
health or hop moves on it). A request naming no model is not this rule's business.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.support.attempts import A_HEADERS, MESSAGES, anthropic_sdk, openai_sdk, settled
from tests.support.harness import Gateway, Stub, http
from tests.support.stub_upstream import ANTHROPIC_MODELS, stub_text

HAIKU, OPUS = "claude-haiku-4-5", "claude-opus-4-1"
MINI = "gpt-5-mini"
ACCOUNTS = """
[[account]]
id = "anthropic-haiku"
provider_binding = "anthropic"
base_url = "{url}"
auth_style = "x-api-key"
credential_env = "GATEWAY_HAIKU_KEY"
models = ["claude-haiku-*"]

[[account]]
id = "openai-mini"
provider_binding = "openai"
base_url = "{url}"
auth_style = "bearer"
credential_env = "GATEWAY_MINI_KEY"
models = ["gpt-5-mini"]
"""


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, stub: Stub) -> Iterator[Gateway]:
    workdir = tmp_path_factory.mktemp("scope")
    accounts = workdir / "accounts.toml"
    accounts.write_text(ACCOUNTS.format(url=stub.url))
    gateway = Gateway(
        workdir,
        stub,
        {
            "GATEWAY_ACCOUNTS_FILE": str(accounts),
            "GATEWAY_HAIKU_KEY": stub.anthropic_key,
            "GATEWAY_MINI_KEY": stub.openai_key,
        },
    ).start()
    status, _, body = gateway.api(
        "PUT",
        "/control/v2/policy/level",
        {
            "name": "platform",
            "expected_revision": 0,
            "reason": "issue 13",
            "document": {"account_order": ["anthropic-haiku", "openai-mini"]},
        },
    )
    assert status == 200, body
    yield gateway
    gateway.stop()


def mint_v2(gw: Gateway, model: str, dispatch_id: str) -> dict[str, Any]:
    status, _, body = gw.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": dispatch_id,
            "repo_slug": "acme/app",
            "principal_kind": "worker",
            "principal_id": "w-1",
            "model": model,
        },
    )
    assert status == 201, body
    return body


def account_view(gw: Gateway, account_id: str) -> dict[str, Any]:
    accounts = gw.api("GET", "/control/v2/accounts")[2]["accounts"]
    return next(a for a in accounts if a["id"] == account_id)


def assert_refused_row(row: dict[str, Any], model: str | None) -> None:
    assert (row["status"], row["http_status"]) == ("refused", 400)
    assert (row["refusal_reason"], row["condition"]) == ("model-not-permitted", None)
    assert row["requested_model"] == model and row["usage"] is None


# ---- the Anthropic wire ---------------------------------------------------------------------


def test_a_v2_lease_on_a_haiku_account_never_reaches_opus(gw: Gateway, clean_stub: Stub) -> None:
    minted = mint_v2(gw, HAIKU, "d-haiku")
    assert minted["account_id"] == "anthropic-haiku"
    sdk = anthropic_sdk(gw, minted["token"])
    for model in (OPUS, "gpt-5"):
        with pytest.raises(anthropic.BadRequestError) as caught:
            sdk.messages.create(model=model, max_tokens=8, messages=MESSAGES)
        error = caught.value
        assert error.status_code == 400 and error.response.headers["x-should-retry"] == "false"
        assert error.body["type"] == "error"
        assert error.body["error"]["type"] == "invalid_request_error"
        assert error.body["error"]["code"] == "model-not-permitted"
        assert error.response.headers["request-id"] == error.body["request_id"]
    with pytest.raises(anthropic.BadRequestError):  # a stream is refused before it starts
        with sdk.messages.stream(model=OPUS, max_tokens=8, messages=MESSAGES) as stream:
            stream.get_final_text()
    with pytest.raises(anthropic.BadRequestError):  # count_tokens names a model: checked too
        sdk.messages.count_tokens(model=OPUS, messages=MESSAGES)
    assert clean_stub.requests() == []  # no upstream call

    rows = settled(gw, minted["key_id"], 4)
    for row, model in zip(rows, (OPUS, "gpt-5", OPUS, OPUS)):
        assert_refused_row(row, model)
    assert rows[0]["attempt_id"].startswith("att_")

    # what the account serves still goes through, and what names no model is not refused
    assert sdk.messages.create(model=HAIKU, max_tokens=8, messages=MESSAGES).content[0].text == stub_text()
    assert sdk.messages.count_tokens(model=HAIKU, messages=MESSAGES).input_tokens > 0
    assert [m.id for m in sdk.models.list()] == list(ANTHROPIC_MODELS)
    rows = settled(gw, minted["key_id"], 7)
    assert [r["status"] for r in rows[4:]] == ["completed"] * 3
    assert gw.revoke(minted["key_id"])


def test_a_compressed_body_is_checked_and_an_unreadable_one_refused(gw: Gateway, clean_stub: Stub) -> None:
    minted = mint_v2(gw, HAIKU, "d-gzip")
    url = gw.dataplane_url + "/v1/messages"
    headers = {**A_HEADERS, "x-api-key": minted["token"]}
    body = json.dumps({"model": OPUS, "max_tokens": 8, "messages": MESSAGES}).encode()
    status, got, answer = http("POST", url, gzip.compress(body), {**headers, "Content-Encoding": "gzip"})
    assert (status, answer["error"]["code"], got["x-should-retry"]) == (400, "model-not-permitted", "false")
    status, got, answer = http("POST", url, body, {**headers, "Content-Encoding": "br"})  # SPEC §19
    assert (status, answer["error"]["code"], got["x-should-retry"]) == (415, "unsupported-content-encoding", "false")
    assert "content-encoding" in answer["error"]["message"]
    assert clean_stub.requests() == []
    rows = settled(gw, minted["key_id"], 2)
    assert_refused_row(rows[0], OPUS)
    assert (rows[1]["status"], rows[1]["http_status"], rows[1]["refusal_reason"], rows[1]["condition"]) == (
        "refused",
        415,
        "unsupported-content-encoding",
        None,
    )
    assert gw.revoke(minted["key_id"])


def test_a_v1_lease_reaches_only_its_legacy_accounts_models(gw: Gateway, clean_stub: Stub) -> None:
    anthropic_lease = gw.mint("anthropic")  # legacy-anthropic: claude-*
    openai_lease = gw.mint("openai")  # legacy-openai: gpt-*, o[0-9]*, codex-*
    with pytest.raises(anthropic.BadRequestError) as caught:
        anthropic_sdk(gw, anthropic_lease["token"]).messages.create(model="gpt-5", max_tokens=8, messages=MESSAGES)
    assert caught.value.body["error"]["code"] == "model-not-permitted"
    with pytest.raises(openai.BadRequestError) as caught_o:
        openai_sdk(gw, openai_lease["token"]).chat.completions.create(model=OPUS, messages=MESSAGES)
    assert caught_o.value.code == "model-not-permitted"
    assert clean_stub.requests() == []
    assert_refused_row(settled(gw, anthropic_lease["key_id"])[0], "gpt-5")
    assert_refused_row(settled(gw, openai_lease["key_id"])[0], OPUS)
    for lease in (anthropic_lease, openai_lease):
        assert gw.revoke(lease["key_id"])


def test_legacy_openai_serves_embedding_models(gw: Gateway, clean_stub: Stub) -> None:
    """SPEC §4: `legacy-openai`'s globs include `text-embedding-*`, so a v1 openai lease embeds."""
    lease = gw.mint("openai")
    embedded = openai_sdk(gw, lease["token"]).embeddings.create(model="text-embedding-3-small", input=["a", "b"])
    assert len(embedded.data) == 2
    assert [r["path"] for r in clean_stub.requests()] == ["/v1/embeddings"]
    row = settled(gw, lease["key_id"])[0]
    assert (row["status"], row["refusal_reason"], row["requested_model"]) == (
        "completed",
        None,
        "text-embedding-3-small",
    )
    assert gw.revoke(lease["key_id"])


# ---- the OpenAI wire ------------------------------------------------------------------------


def test_a_v2_lease_on_the_openai_wire_is_held_to_its_models(gw: Gateway, clean_stub: Stub) -> None:
    minted = mint_v2(gw, MINI, "d-mini")
    assert minted["account_id"] == "openai-mini"
    sdk = openai_sdk(gw, minted["token"])
    refusals = [
        lambda: sdk.chat.completions.create(model="gpt-5", messages=MESSAGES),
        lambda: list(sdk.chat.completions.create(model="gpt-5", messages=MESSAGES, stream=True)),
        lambda: sdk.responses.create(model="gpt-5", input="hi"),
        lambda: sdk.embeddings.create(model="text-embedding-3-small", input="hi"),
    ]
    for refused in refusals:
        with pytest.raises(openai.BadRequestError) as caught:
            refused()
        error = caught.value
        assert error.response.headers["x-should-retry"] == "false"
        assert error.code == "model-not-permitted" and error.type == "invalid_request_error"
        assert error.response.headers["x-request-id"].startswith("att_")
    assert clean_stub.requests() == []
    rows = settled(gw, minted["key_id"], 4)
    for row, model in zip(rows, ("gpt-5", "gpt-5", "gpt-5", "text-embedding-3-small")):
        assert_refused_row(row, model)
    assert sdk.chat.completions.create(model=MINI, messages=MESSAGES).choices[0].message.content == stub_text()
    assert sdk.models.list().data  # GET /v1/models names no model
    assert [r["status"] for r in settled(gw, minted["key_id"], 6)[4:]] == ["completed"] * 2
    assert gw.revoke(minted["key_id"])


# ---- never evidence -------------------------------------------------------------------------


def test_a_refusal_moves_no_circuit_no_health_and_licenses_no_hop(gw: Gateway, clean_stub: Stub) -> None:
    minted = mint_v2(gw, HAIKU, "d-evidence")
    before = account_view(gw, "anthropic-haiku")
    sdk = anthropic_sdk(gw, minted["token"])
    for _ in range(4):  # more than the 3 a circuit opens on, were they evidence
        with pytest.raises(anthropic.BadRequestError):
            sdk.messages.create(model=OPUS, max_tokens=8, messages=MESSAGES)
    settled(gw, minted["key_id"], 4)
    after = account_view(gw, "anthropic-haiku")
    assert after["circuit"]["state"] == "closed"
    assert after["observed_request_count"] == before["observed_request_count"]
    assert (after["health"], after["health_reason"]) == (before["health"], before["health_reason"])
    assert gw.revoke(minted["key_id"])
    status, _, retry = gw.api(
        "POST",
        "/control/v2/mint",
        {
            "dispatch_id": "d-evidence",
            "repo_slug": "acme/app",
            "principal_kind": "worker",
            "principal_id": "w-1",
            "model": HAIKU,
            "retry_of_mint_decision_id": minted["mint_decision_id"],
        },
    )
    assert (status, retry["outcome"], retry["refusal_reason"]) == (503, "held", "fallback-not-authorised")
