"""Terminal attempt rows for the spend and ledger tests: one helper, every field a default."""

from __future__ import annotations

import itertools

from shared.wire import AttemptRow, Usage

_ids = itertools.count(1)
NO_USAGE = None


def row(
    finished_at: str,
    *,
    repo: str = "acme/pay",
    role: str | None = None,
    account: str = "legacy-anthropic",
    model: str | None = "claude-sonnet-4-6",
    principal: str = "w-1",
    cost: float | None = 0.5,
    usage: tuple[int, int, int, int] | None = (10, 20, 0, 0),
    attempt_id: str | None = None,
    status: str = "completed",
) -> AttemptRow:
    return AttemptRow(
        attempt_id=attempt_id or f"att_{next(_ids):08d}",
        key_id="key_1",
        account_id=account,
        mint_decision_id=None,
        dispatch_id=None,
        repo_slug=repo,
        principal_id=principal,
        wire="anthropic",
        path="/v1/messages",
        requested_model=model,
        served_model=model,
        stream=False,
        started_at=finished_at,
        finished_at=finished_at,
        status=status,
        http_status=200,
        condition=None,
        refusal_reason=None,
        usage=None
        if usage is None
        else Usage(
            input_tokens=usage[0], output_tokens=usage[1], cache_read_tokens=usage[2], cache_creation_tokens=usage[3]
        ),
        cost_usd=cost,
        cost_reason="priced" if cost is not None else ("unpriced" if usage else "no-usage"),
        overhead_ms=0.1,
        principal_kind="worker",
        worker_role=role,
    )
