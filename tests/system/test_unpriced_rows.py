"""Usage the ledger needs (SPEC §19), control's half, with the real daemons and the stub: a
served (2xx) answer of a generating path that carries no usage is `unpriced` (cost null,
counted in `unpriced_attempts` of every scope and budget it falls in), never $0 in silence —
whatever the data plane asked the upstream for; `count_tokens` and `/v1/models` cost $0
(`not-billed`) and are never unpriced.

The stub is scripted to answer 200 with a body that has no `usage` (a provider or a proxy that
drops it), on the Anthropic and the OpenAI wire.
"""

from __future__ import annotations

import json

from tests.support.attempts import A_HEADERS, settled
from tests.support.harness import Gateway, Stub, http

MODEL = "claude-sonnet-4-6"
NO_USAGE_MESSAGE = json.dumps(
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
    }
)
NO_USAGE_CHAT = json.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-5",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    }
)
MESSAGES = [{"role": "user", "content": "hi"}]


def put(gw: Gateway, name: str, document: dict) -> None:
    revision = gw.api("GET", "/control/v2/policy")[2]["revision"]
    status, _, body = gw.api(
        "PUT",
        "/control/v2/policy/level",
        {"name": name, "expected_revision": revision, "document": document, "reason": "budget"},
    )
    assert status == 200, body


def step(body: str) -> str:
    return json.dumps({"status": 200, "body": body, "headers": {"content-type": "application/json"}})


def test_a_served_answer_without_usage_is_unpriced_and_count_tokens_is_not_billed(
    make_gateway, clean_stub: Stub
) -> None:
    gw = make_gateway().start()
    put(gw, "repo:acme/app", {"budgets": [{"window": "day", "usd": 5.0}]})
    anthropic_lease, openai_lease = gw.mint("anthropic"), gw.mint("openai")
    a_headers = {**A_HEADERS, "x-api-key": anthropic_lease["token"]}
    o_headers = {"authorization": f"Bearer {openai_lease['token']}", "content-type": "application/json"}
    answered = [
        http(
            "POST",
            gw.dataplane_url + "/v1/messages",
            {"model": MODEL, "max_tokens": 8, "messages": MESSAGES},
            {**a_headers, "x-stub-step": step(NO_USAGE_MESSAGE)},
        ),
        http(
            "POST",
            gw.dataplane_url + "/v1/chat/completions",
            {"model": "gpt-5", "messages": MESSAGES},
            {**o_headers, "x-stub-step": step(NO_USAGE_CHAT)},
        ),
        http("POST", gw.dataplane_url + "/v1/messages/count_tokens", {"model": MODEL, "messages": MESSAGES}, a_headers),
        http("GET", gw.dataplane_url + "/v1/models", None, o_headers),
    ]
    assert [status for status, _, _ in answered] == [200, 200, 200, 200], answered
    rows = settled(gw, anthropic_lease["key_id"], 2) + settled(gw, openai_lease["key_id"], 2)
    by_path = {r["path"]: (r["usage"] is None, r["cost_usd"], r["cost_reason"]) for r in rows}
    assert by_path["/v1/messages"] == (True, None, "unpriced"), rows
    assert by_path["/v1/chat/completions"] == (True, None, "unpriced"), rows
    assert by_path["/v1/messages/count_tokens"][1:] == (0.0, "not-billed"), rows
    assert by_path["/v1/models"][1:] == (0.0, "not-billed"), rows

    budgets = gw.api("GET", "/control/v2/budgets")[2]["budgets"]
    budget = next(b for b in budgets if b["level"] == "repo:acme/app")
    assert (budget["unpriced_attempts"], budget["spent_usd"]) == (2, 0.0), budget
    spend = gw.api("GET", "/control/v2/spend?window=day&by=repo")[2]
    repo = next(r for r in spend["rows"] if r["key"] == "acme/app")
    assert (repo["attempts"], repo["unpriced_attempts"], repo["cost_usd"]) == (4, 2, 0.0), repo
