"""An attempt's started row is built from a per-lease template (issue 27): it must be exactly
the row the full constructor builds, for every lease and wire, and a replaced lease (a new
object with new fields) must never get the old lease's fields."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from dataplane import attempt as attempt_module
from dataplane.attempt import Attempt
from dataplane.stamps import iso_ms
from dataplane.wires.table import WIRES
from shared.wire import AttemptRow, Lease


def _lease(**changes: Any) -> Lease:
    fields: dict[str, Any] = {
        "key_id": "key_01",
        "digest": b"\x00" * 32,
        "account_id": "acct-a",
        "expires_at_ms": 4_102_444_799_999,
        "principal_kind": "human",
        "principal_id": "alice",
        "repo_slug": "org/repo",
        "dispatch_id": "dsp_1",
        "mint_decision_id": "dec_1",
        "worker_role": "implementer",
        "hop": 2,
    }
    return Lease(**{**fields, **changes})


def _full_row(attempt: Attempt) -> AttemptRow:
    """The started row as the one-shot constructor builds it (the reference)."""
    lease = attempt.lease
    return AttemptRow(
        attempt_id=attempt.attempt_id,
        key_id=lease.key_id,
        account_id=lease.account_id,
        mint_decision_id=lease.mint_decision_id,
        dispatch_id=lease.dispatch_id,
        repo_slug=lease.repo_slug,
        principal_id=lease.principal_id,
        principal_kind=lease.principal_kind,
        worker_role=lease.worker_role,
        wire=attempt.wire,
        path=attempt.path,
        requested_model=attempt.requested_model,
        stream=attempt.stream,
        started_at=iso_ms(attempt.started_ms),
        overhead_ms=attempt.overhead_ms,
        bytes_out=attempt.bytes_out,
        served_model=None,
        finished_at=None,
        status=None,
        http_status=None,
        condition=None,
        refusal_reason=None,
        usage=None,
        cost_usd=None,
        cost_reason=None,
        traceparent=attempt.trace[0],
        tracestate=attempt.trace[1],
        hop=lease.hop,
    )


def _attempt(lease: Lease, wire: str, path: str, trace: tuple[str | None, str | None]) -> Attempt:
    async def make() -> Attempt:
        return Attempt(None, lease, WIRES[wire], path, trace)  # type: ignore[arg-type]

    return asyncio.run(make())


def test_the_started_row_is_the_full_row_for_every_lease_and_wire() -> None:
    leases = [_lease(), _lease(key_id="key_02", dispatch_id=None, worker_role=None, hop=0)]
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    for lease in leases:
        for wire, path in (("anthropic", "/v1/messages"), ("openai", "/v1/chat/completions")):
            for trace in ((None, None), (parent, "vendor=1")):
                attempt = _attempt(lease, wire, path, trace)
                attempt.requested_model = "claude-haiku-4-5"
                attempt.stream = True
                attempt.overhead_ms = 0.25
                attempt.bytes_out = 7
                row = attempt._started_row()
                assert row == _full_row(attempt)
                assert msgspec.json.encode(row) == msgspec.json.encode(_full_row(attempt))


def test_a_replaced_lease_never_gets_the_old_template() -> None:
    old = _lease()
    first = _attempt(old, "anthropic", "/v1/messages", (None, None))._started_row()
    new = msgspec.structs.replace(old, account_id="acct-b", repo_slug="org/other", hop=3)
    second = _attempt(new, "anthropic", "/v1/messages", (None, None))
    assert second._started_row() == _full_row(second)
    assert (first.account_id, second._started_row().account_id) == ("acct-a", "acct-b")


def test_the_template_memo_is_bounded() -> None:
    for n in range(attempt_module.TEMPLATES_MAX + 5):
        attempt_module._template(_lease(key_id=f"key_{n}"), "anthropic")
    assert len(attempt_module._templates) <= attempt_module.TEMPLATES_MAX


# `Attempt.overhead_header` formats once and parses back instead of `round(x, 3)` then a
# format (issue 27): the header's text and the row's value must be exactly the old ones.
_TRICKY = [0.0, 0.0004, 0.0005, 0.0015, 2.675, 1.0005, 999.9995, 123456.7895, -0.0004, -1.2345, 1e15 + 0.5]


def _old(x: float) -> tuple[str, float]:
    value = round(x, 3)
    return f"{value:.3f}", value


@given(st.floats(min_value=-1e9, max_value=1e12, allow_nan=False) | st.sampled_from(_TRICKY))
def test_formatting_once_gives_rounds_value_and_text(x: float) -> None:
    text, value = _old(x)
    assert f"{x:.3f}" == text
    assert repr(float(f"{x:.3f}")) == repr(value)  # (repr: -0.0 stays -0.0)


def test_the_overhead_header_is_the_rows_overhead() -> None:
    attempt = _attempt(_lease(), "anthropic", "/v1/messages", (None, None))
    text = attempt.overhead_header(0.0)
    assert attempt.overhead_ms is not None
    assert (text, attempt.overhead_ms) == _old(attempt.overhead_ms)
    attempt.overhead_header(1e6)  # an upstream wait longer than the attempt: negative, as before
    assert attempt.overhead_ms is not None and attempt.overhead_ms < 0
