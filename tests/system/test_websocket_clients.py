"""Real clients over the Responses WebSocket (SPEC §20): the `openai` SDK's `responses.connect()`.

(Codex CLI over the socket is in `test_real_clients.py`, beside its HTTP runs.)
"""

from __future__ import annotations

import openai

from tests.support.attempts import O_MODEL, settled
from tests.support.harness import Gateway, Stub
from tests.support.stub_upstream import stub_text


def test_openai_sdk_responses_connect_chains_turns(gateway: Gateway, clean_stub: Stub) -> None:
    minted = gateway.mint("openai")
    client = openai.OpenAI(base_url=gateway.dataplane_url + "/v1", api_key=minted["token"], max_retries=0)
    previous = None
    texts = []
    with client.responses.connect(max_retries=0) as connection:
        for _ in range(3):
            fields = {"previous_response_id": previous} if previous else {}
            connection.response.create(model=O_MODEL, input="hi", **fields)
            text = ""
            for event in connection:
                if event.type == "response.output_text.delta":
                    text += event.delta
                if event.type in ("response.completed", "error"):
                    break
            assert event.type == "response.completed", event
            previous = event.response.id
            texts.append(text)
    assert texts == [stub_text()] * 3
    rows = settled(gateway, minted["key_id"], 3)
    assert [(r["transport"], r["status"]) for r in rows] == [("websocket", "completed")] * 3
    entries = [e for e in clean_stub.requests() if e["method"] == "WS"]
    assert [e["previous_response_id"] is None for e in entries] == [True, False, False]
    assert entries[0]["headers"]["authorization"] == f"Bearer {clean_stub.openai_key}"
    assert minted["token"] not in str(entries[0]["headers"])
