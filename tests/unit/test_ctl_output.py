"""leaseholdctl's renderings: each fact in its own column, absence shown as "-", SSE parsed per spec."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from controlplane.cli import admin, policy
from controlplane.cli.client import Reply
from controlplane.cli.exits import Exit
from controlplane.cli.keys import describe_v1, describe_v2, v2_exit
from controlplane.cli.output import cell, hhmmss, render_table, skipped_text
from controlplane.cli.views import SseParser, accounts_table, admin_line, circuit_text, routes_table, watch_frame

CLOSED = {"state": "closed", "opened_at": None, "retry_at": None, "opened_by": None}


def account(**over: Any) -> dict[str, Any]:
    base = {
        "id": "legacy-anthropic",
        "provider_binding": "anthropic",
        "configured": True,
        "administrative_state": "enabled",
        "lease_count": 2,
        "in_flight_count": 1,
        "observed_request_count": 5,
        "observed_aborted_count": 0,
        "circuit": CLOSED,
        "health": "healthy",
        "health_reason": "within-threshold",
    }
    return {**base, **over}


def view(*accounts: dict[str, Any], truncated: bool = False) -> dict[str, Any]:
    return {
        "accounts": list(accounts),
        "window_seconds": 900,
        "as_of": "2026-11-30T10:00:00.000Z",
        "evidence_since": "2026-11-30T09:00:00.000Z",
        "evidence_truncated": truncated,
    }


def test_render_table_aligns_and_marks_absence() -> None:
    assert render_table(("A", "LONGER"), [("x", None), ("yyyy", True)]).splitlines() == [
        "A     LONGER",
        "x     -",
        "yyyy  yes",
    ]


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, "-"), ("", "-"), (False, "no"), (0, "0"), (0.0, "0"), (0.00123, "0.00123"), ([1], "[1]"), ("a", "a")],
)
def test_cell(value: Any, text: str) -> None:
    assert cell(value) == text


def test_accounts_table_keeps_each_fact_in_its_own_column() -> None:
    unconfigured = account(
        id="legacy-openai",
        provider_binding="openai",
        configured=False,
        lease_count=0,
        in_flight_count=0,
        observed_request_count=4,
        observed_aborted_count=4,
        health="unverified",
        health_reason="credential-missing",
        administrative_state="draining",
    )
    opened = account(
        id="team-b",
        circuit={
            "state": "open",
            "opened_at": "2026-11-30T10:00:00.000Z",
            "retry_at": "2026-11-30T10:00:30.000Z",
            "opened_by": "rate-limited",
        },
        health="degraded",
        health_reason="qualifying-failures",
    )
    lines = accounts_table(view(account(), unconfigured, opened, truncated=True)).splitlines()
    assert lines[0].split() == [
        "ID",
        "BINDING",
        "CONFIGURED",
        "ADMIN",
        "LEASES",
        "IN",
        "FLIGHT",
        "OBSERVED",
        "CIRCUIT",
        "HEALTH",
        "HEADROOM",
    ]
    assert lines[1].split() == [
        "legacy-anthropic",
        "anthropic",
        "yes",
        "enabled",
        "2",
        "1",
        "5",
        "closed",
        "healthy",
        "(within-threshold)",
        "-",
    ]
    assert lines[2].split() == [
        "legacy-openai",
        "openai",
        "no",
        "draining",
        "0",
        "0",
        "4",
        "(4",
        "aborted)",
        "closed",
        "unverified",
        "(credential-missing)",
        "-",
    ]
    assert "open until 10:00:30Z (rate-limited)" in lines[3] and "degraded (qualifying-failures)" in lines[3]
    assert "window 900s" in lines[4] and "evidence truncated" in lines[4]


def kind(percent: float | None, current: bool = True, reset_at: str = "2026-11-30T10:05:00.000Z") -> dict:
    return {
        "limit": 100,
        "remaining": 1,
        "reset_at": reset_at,
        "observed_at": "2026-11-30T10:00:00.000Z",
        "headroom_percent": percent,
        "current": current,
    }


@pytest.mark.parametrize(
    ("rate_limits", "text"),
    [
        (None, "-"),
        ({}, "-"),
        (
            {"requests": kind(98.0), "tokens": kind(3.8, reset_at="2026-11-30T10:01:00.000Z")},
            "3.8% tokens, resets 10:01:00Z",
        ),
        ({"tokens": kind(0.0, current=False), "requests": kind(50.0)}, "50% requests, resets 10:05:00Z"),
        ({"tokens": kind(None)}, "-"),
        ({"tokens": "garbage"}, "-"),
    ],
)
def test_headroom_text_is_the_lowest_current_kind(rate_limits: dict | None, text: str) -> None:
    from controlplane.cli.views import headroom_text

    assert headroom_text(rate_limits) == text


def test_accounts_table_has_a_headroom_column() -> None:
    lines = accounts_table(view(account(rate_limits={"tokens": kind(7.5)}))).splitlines()
    assert lines[0].endswith("HEADROOM") and lines[1].endswith("7.5% tokens, resets 10:05:00Z")


@pytest.mark.parametrize(
    ("circuit", "text"),
    [
        (CLOSED, "closed"),
        (
            {"state": "half-open", "opened_by": "overloaded", "retry_at": "2026-11-30T10:00:30Z"},
            "half-open (overloaded)",
        ),
        (None, "-"),
    ],
)
def test_circuit_text(circuit: dict | None, text: str) -> None:
    assert circuit_text(circuit) == text


ROW = {
    "attempt_id": "at_1",
    "key_id": "K1",
    "account_id": "legacy-anthropic",
    "repo_slug": "acme/app",
    "principal_id": "w-1",
    "path": "/v1/messages",
    "requested_model": "claude-x",
    "served_model": "claude-x-1",
    "stream": True,
    "started_at": "2026-11-30T10:00:01.250Z",
    "status": "completed",
    "http_status": 200,
    "condition": None,
    "refusal_reason": None,
    "usage": {"input_tokens": 12, "output_tokens": 3},
    "cost_usd": 0.00021,
    "cost_reason": "priced",
    "overhead_ms": 1.5,
}


def test_routes_tables() -> None:
    active = routes_table({"routes": [ROW], "count": 1, "dataplane_connected": True}, finished=False).splitlines()
    assert active[1].split() == [
        "10:00:01Z",
        "at_1",
        "legacy-anthropic",
        "K1",
        "acme/app",
        "w-1",
        "/v1/messages",
        "claude-x",
        "yes",
    ]
    failed = {
        **ROW,
        "status": "upstream-error",
        "http_status": 429,
        "condition": "rate-limited",
        "usage": None,
        "cost_usd": None,
        "cost_reason": "no-usage",
    }
    recent = routes_table(
        {"routes": [ROW, failed], "truncated": True, "retained": 200, "evidence_since": None}, finished=True
    ).splitlines()
    assert recent[1].split()[6:] == ["completed", "200", "-", "12/3", "0.00021", "1.5"]
    assert recent[2].split()[6:] == ["upstream-error", "429", "rate-limited", "-", "no-usage", "1.5"]
    assert "2 shown of 200 retained" in recent[3] and "truncated" in recent[3] and "since -" in recent[3]


def test_empty_routes_say_so_and_a_lost_data_plane_is_named() -> None:
    text = routes_table({"routes": [], "dataplane_connected": False}, finished=False)
    assert text.startswith("no route in flight") and "NOT connected" in text


SELECTED = {
    "outcome": "selected",
    "mint_decision_id": "md_1",
    "account_id": "team-b",
    "fallback_position": 1,
    "hop": 1,
    "token": "lhgw_X.s",
    "key_id": "X",
    "expires_at": "T",
    "base_url": "http://dp",
    "effective_model": "claude-x",
    "policy_revision": 3,
    "skipped": [{"account_id": "legacy-anthropic", "position": 0, "code": "circuit-open"}],
}
HELD = {
    "outcome": "held",
    "refusal_reason": "no-eligible-account",
    "mint_decision_id": "md_2",
    "skipped": [
        {"account_id": "a", "position": 0, "code": "not-configured"},
        {"account_id": "b", "position": 1, "code": "administrative-disabled"},
    ],
}
REJECTED = {"outcome": "rejected", "refusal_reason": "fallback-pool-exhausted", "mint_decision_id": "md_3"}


@dataclass(frozen=True)
class V2Case:
    name: str
    status: int
    body: dict[str, Any]
    exit: Exit | None
    lines: tuple[str, ...]


V2_CASES = [
    V2Case(
        "selected",
        201,
        SELECTED,
        Exit.OK,
        (
            "outcome     selected",
            "account     team-b (position 1, hop 1)",
            "key_id      X",
            "token       lhgw_X.s",
            "policy      revision 3",
            "skipped     legacy-anthropic@0 circuit-open",
        ),
    ),
    V2Case(
        "held",
        503,
        HELD,
        Exit.HELD,
        (
            "outcome      held",
            "refusal      no-eligible-account",
            "Retry-After  5",
            "skipped      a@0 not-configured, b@1 administrative-disabled",
        ),
    ),
    V2Case("rejected", 409, REJECTED, Exit.REJECTED, ("refusal   fallback-pool-exhausted", "skipped   -")),
    V2Case("not an outcome", 422, {"error": {"code": "invalid-request"}}, None, ()),
]


@pytest.mark.parametrize("case", V2_CASES, ids=lambda c: c.name)
def test_v2_outcomes(case: V2Case) -> None:
    reply = Reply(case.status, {"retry-after": "5"}, case.body)
    assert v2_exit(reply) == case.exit
    if case.lines:
        text = describe_v2(case.body, "5").splitlines()
        for line in case.lines:
            assert line in text


def test_v1_answer() -> None:
    text = describe_v1(
        {
            "token": "lhgw_A.b",
            "key_id": "A",
            "account_id": "legacy-openai",
            "expires_at": "T",
            "base_url": "http://dp/v1",
        }
    )
    assert text.splitlines()[0] == "account     legacy-openai" and "base_url    http://dp/v1" in text


def test_skipped_and_time_helpers() -> None:
    assert skipped_text([]) == "-" and skipped_text(None) == "-"
    assert hhmmss("2026-11-30T10:00:01.250Z") == "10:00:01Z" and hhmmss(None) == "-"


AUDIT = {
    "revision": 2,
    "chain_verdict": "verified",
    "chain_reason": None,
    "records": [
        {
            "seq": 0,
            "at": "T0",
            "actor": "ops",
            "actor_authenticated_by": "control-token",
            "account_id": "a",
            "action": "set-state",
            "state": "disabled",
            "reason": "incident 7",
        },
        {
            "seq": 1,
            "at": "T1",
            "actor": None,
            "actor_authenticated_by": "control-token",
            "account_id": "a",
            "action": "revoke-leases",
            "state": None,
            "reason": "leak",
        },
    ],
}


def test_admin_audit_and_mutation_lines() -> None:
    lines = admin.audit_table(AUDIT).splitlines()
    assert lines[0] == "chain verified, revision 2"
    assert lines[2].split() == [
        "0",
        "T0",
        "a",
        "set-state",
        "disabled",
        "ops",
        "(via",
        "control-token)",
        "incident",
        "7",
    ]
    assert lines[3].split()[3:6] == ["revoke-leases", "-", "-"]
    corrupt = admin.audit_table(
        {"revision": 3, "chain_verdict": "corrupt", "chain_reason": "head-mismatch", "records": []}
    )
    assert corrupt.splitlines() == ["chain corrupt, revision 3 (head-mismatch)", "no administrative record"]
    assert admin.describe_mutation("drain", "a", {"revision": 4}) == "a: draining; revision 4"
    assert (
        admin.describe_mutation("revoke-leases", "a", {"revision": 5, "revoked": 2})
        == "a: revoked 2 lease(s); revision 5"
    )


def test_admin_line_never_renders_absence_as_a_fact() -> None:
    assert admin_line(None) == "admin chain: not served by this control daemon"
    assert (
        admin_line({"chain_verdict": "corrupt", "revision": 2, "chain_reason": "torn-line"})
        == "admin chain: corrupt, revision 2 (torn-line)"
    )


def test_watch_frame_says_unreachable_instead_of_an_empty_table() -> None:
    text = watch_frame("http://c", None, None, None, "cannot reach the control daemon at http://c", "NOW")
    assert "cannot reach the control daemon" in text and "ID" not in text
    full = watch_frame("http://c", view(account()), {"routes": []}, None, None, "NOW")
    assert "legacy-anthropic" in full and "ROUTES IN FLIGHT" in full and "not served" in full


def test_policy_renderings() -> None:
    body = {
        "revision": 2,
        "chain_verdict": "verified",
        "levels": {"platform": {"max_fallback_hops": 1}, "team:core": {"repos": ["acme/app"]}},
    }
    text = policy.describe_policy(body)
    assert text.startswith("chain verified, revision 2") and "[team:core]" in text and '"acme/app"' in text
    assert "no level document" in policy.describe_policy({"revision": 0, "chain_verdict": "absent", "levels": []})
    as_list = policy.describe_policy({"levels": [{"name": "platform", "document": {"providers": ["openai"]}}]})
    assert "[platform]" in as_list and '"openai"' in as_list
    assert "withheld" in policy.describe_policy({"chain_verdict": "corrupt", "revision": 3, "levels": None})
    level = policy.describe_level(
        "repo:acme/app",
        {"name": "repo:acme/app", "revision": 5, "written_at_revision": 2, "document": {"providers": ["anthropic"]}},
    )
    assert level.splitlines()[0] == "[repo:acme/app] written at revision 2"
    never = policy.describe_level("platform", {"name": "platform", "revision": 5, "document": None})
    assert never.splitlines() == ["[platform] policy revision 5", "no document at this level"]
    explain = policy.describe_explain(
        {
            "policy_revision": 4,
            "chain_verdict": "verified",
            "tenancy": {
                "team": "core",
                "org": None,
                "levels": [{"name": "platform", "present": False}, {"name": "team:core", "present": True}],
            },
            "resolved": {"account_order": ["b", "a"], "providers": ["anthropic"], "max_fallback_hops": 1},
            "provenance": {"account_order": "team:core", "providers": "team:core", "max_fallback_hops": "ceiling"},
            "locked_by": {"providers": "team:core"},
            "vetoed": {"providers": ["repo:acme/app"]},
            "candidates": [
                {
                    "account_id": "b",
                    "position": 0,
                    "provider_binding": "anthropic",
                    "effective_model": "m",
                    "code": "administrative-disabled",
                    "filters": ["administrative-disabled", "circuit-open"],
                },
                {
                    "account_id": "a",
                    "position": 1,
                    "provider_binding": "anthropic",
                    "effective_model": "m",
                    "code": None,
                    "filters": [],
                },
            ],
            "would_select": {"outcome": "selected", "account_id": "a", "fallback_position": 1},
        }
    )
    lines = explain.splitlines()
    assert lines[:2] == ["policy revision 4, chain verified", "team core, org -; levels platform (empty) < team:core"]
    assert 'account_order      ["b","a"]  (from team:core)' in lines
    assert 'providers          ["anthropic"]  (from team:core; locked at team:core; vetoed: repo:acme/app)' in lines
    assert "max_fallback_hops  1  (from ceiling)" in lines
    assert lines[-4].split()[-2:] == ["administrative-disabled,", "circuit-open"]
    assert lines[-3].split()[-1] == "eligible"
    assert lines[-1] == "a mint now would select: a (position 1)"
    held = policy.describe_explain(
        {"candidates": [], "would_select": {"outcome": "rejected", "refusal_reason": "model-not-served"}}
    )
    assert "no candidate serves this model" in held and "nothing: model-not-served" in held
    unbelievable = policy.describe_explain(
        {
            "chain_verdict": "corrupt",
            "chain_reason": "hash-mismatch",
            "resolved": None,
            "candidates": None,
            "would_select": {"outcome": "held", "refusal_reason": "policy-unavailable"},
        }
    )
    assert "chain corrupt (hash-mismatch)" in unbelievable and "cannot be resolved" in unbelievable
    assert "nothing: policy-unavailable" in unbelievable
    audit = policy.audit_table(
        {
            "revision": 1,
            "chain_verdict": "verified",
            "records": [{"seq": 0, "at": "T", "name": "platform", "actor": None, "reason": "r"}],
        }
    )
    assert audit.splitlines()[2].split() == ["0", "T", "platform", "-", "r"]


@dataclass(frozen=True)
class SseCase:
    name: str
    lines: tuple[str, ...]
    events: tuple[dict[str, Any], ...]


SSE_CASES = [
    SseCase(
        "json data with id and type",
        ("id: 7\r\n", "event: route.started\r\n", 'data: {"a": 1}\r\n', "\r\n"),
        ({"id": "7", "event": "route.started", "data": {"a": 1}},),
    ),
    SseCase("heartbeat comments are not events", (": ping\n", "\n"), ()),
    SseCase(
        "multi-line data joins with newline",
        ("data: one\n", "data:two\n", "\n"),
        ({"id": None, "event": "message", "data": "one\ntwo"},),
    ),
    SseCase(
        "id persists across events",
        ("id: 1\n", "event: gap\n", "data: {}\n", "\n", "event: circuit\n", "data: {}\n", "\n"),
        ({"id": "1", "event": "gap", "data": {}}, {"id": "1", "event": "circuit", "data": {}}),
    ),
    SseCase("blank lines alone dispatch nothing", ("\n", "\n"), ()),
]


@pytest.mark.parametrize("case", SSE_CASES, ids=lambda c: c.name)
def test_sse_parser(case: SseCase) -> None:
    parser = SseParser()
    got = [e for e in (parser.feed(line) for line in case.lines) if e is not None]
    assert tuple(got) == case.events
