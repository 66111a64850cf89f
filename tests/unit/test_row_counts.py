"""The plain row counts render the series and values prometheus-client's own instruments would."""

from __future__ import annotations

from shared.wire import AttemptRow, Usage


def _row(n: int, **changes: object) -> AttemptRow:
    base = dict(
        attempt_id=f"att_{n:04d}",
        key_id="key_1",
        account_id="legacy-anthropic",
        mint_decision_id=None,
        dispatch_id=None,
        repo_slug="acme/widgets",
        principal_id="p",
        wire="anthropic",
        path="/v1/messages",
        requested_model="claude-sonnet-4-5",
        served_model=None,
        stream=False,
        started_at="2026-11-30T12:00:00.000Z",
        finished_at="2026-11-30T12:00:00.010Z",
        status="completed",
        http_status=200,
        condition=None,
        refusal_reason=None,
        usage=Usage(input_tokens=10, output_tokens=5),
        cost_usd=None,
        cost_reason=None,
        overhead_ms=0.2,
    )
    return AttemptRow(**{**base, **changes})  # type: ignore[arg-type]


def _reference_exposition(rows: list[AttemptRow], accounts: frozenset[str]) -> bytes:
    """What prometheus-client's own Counter and Histogram say for `rows` (the instruments the
    row counts replaced), to prove the plain counts render the same series and values."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    from controlplane.rowcounts import OVERHEAD_BUCKETS_S, TOKEN_KINDS, row_labels

    r = CollectorRegistry()
    attempts = Counter(
        "leasehold_attempts", "Terminal attempt rows.", ["account_id", "wire", "status", "condition"], registry=r
    )
    refusals = Counter("leasehold_refusals", "Gateway-authored terminals, by refusal code.", ["code"], registry=r)
    tokens = Counter("leasehold_tokens", "Tokens the upstream reported, by kind.", ["account_id", "kind"], registry=r)
    cost = Counter("leasehold_cost_usd", "Priced cost of terminal attempts in USD.", ["account_id"], registry=r)
    unpriced = Counter(
        "leasehold_attempts_unpriced",
        "Attempts with usage but no price (cost null, never counted as 0).",
        ["account_id"],
        registry=r,
    )
    overhead = Histogram(
        "leasehold_dataplane_overhead_seconds",
        "The data plane's own time before the first upstream byte.",
        ["wire"],
        buckets=OVERHEAD_BUCKETS_S,
        registry=r,
    )
    for row in rows:
        labels = row_labels(row.account_id, row.wire, row.status, row.condition, row.refusal_reason, accounts)
        attempts.labels(labels.account_id, labels.wire, labels.status, labels.condition).inc()
        if labels.refusal is not None:
            refusals.labels(labels.refusal).inc()
        if row.usage is not None:
            for kind in TOKEN_KINDS:
                tokens.labels(labels.account_id, kind).inc(getattr(row.usage, f"{kind}_tokens"))
        if row.cost_usd is not None:
            cost.labels(labels.account_id).inc(row.cost_usd)
        elif row.usage is not None:
            unpriced.labels(labels.account_id).inc()
        if row.overhead_ms is not None:
            overhead.labels(labels.wire).observe(row.overhead_ms / 1000.0)
    return generate_latest(r)


def test_row_counts_render_what_prometheus_instruments_would() -> None:
    from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest

    from controlplane.rowcounts import RowCollector, RowCounts

    disable_created_metrics()
    accounts = frozenset({"legacy-anthropic", "legacy-openai"})
    rows = [
        _row(1),
        _row(2, cost_usd=0.25, overhead_ms=0.5),
        _row(3, overhead_ms=2.5),  # on a bucket bound
        _row(4, account_id="legacy-openai", wire="openai", usage=Usage(cache_read_tokens=7), overhead_ms=9000.0),
        _row(
            5,
            account_id="stranger",
            wire="grpc",
            status="refused",
            refusal_reason="made-up",
            usage=None,
            overhead_ms=None,
        ),
        _row(6, status="upstream_error", condition="rate-limited", usage=None, overhead_ms=0.0),
        _row(7, status="refused", refusal_reason="control-unavailable", usage=None, cost_usd=0.1),
    ]
    reference = _reference_exposition(rows * 3, accounts)
    for memo_max in (RowCounts.MEMO_MAX, 2):  # 2: the memo of raw keys is cleared as rows come
        counts = RowCounts(accounts)
        counts.MEMO_MAX = memo_max
        for row in rows * 3:
            counts.add(row)
        ours = CollectorRegistry()
        ours.register(RowCollector(counts))
        assert generate_latest(ours) == reference


def test_choice_counts_render_what_prometheus_counters_would() -> None:
    """The mint's decisions and the dispatch hops, kept as plain numbers until a scrape, render
    what the two `Counter`s they replaced did (OpenMetrics too: the `_total` suffix once)."""
    from prometheus_client import CollectorRegistry, Counter, disable_created_metrics, generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    from controlplane.metrics import ChoiceCounts

    disable_created_metrics()
    reference = CollectorRegistry()
    decisions = Counter(
        "leasehold_mint_decisions",
        "v2 mint decisions, by outcome and refusal code.",
        ["outcome", "code"],
        registry=reference,
    )
    hops = Counter(
        "leasehold_dispatch_hops",
        "Dispatch keys moved by the gateway, by condition.",
        ["condition"],
        registry=reference,
    )
    choices = ChoiceCounts()
    for outcome, code in [("selected", "none"), ("held", "fallback-lease-still-held"), ("selected", "none")]:
        decisions.labels(outcome, code).inc()
        choices.decision(outcome, code)
    for condition in ["rate-limited", "other", "rate-limited"]:
        hops.labels(condition).inc()
        choices.hop(condition)
    ours = CollectorRegistry()
    ours.register(choices)
    assert generate_latest(ours) == generate_latest(reference)
    assert generate_openmetrics(ours) == generate_openmetrics(reference)
    empty = CollectorRegistry()
    empty.register(ChoiceCounts())
    assert generate_latest(empty) == b"".join(
        line + b"\n"
        for line in generate_latest(reference).splitlines()
        if line.startswith(b"#")  # no series yet: the families' HELP and TYPE, as the Counters'
    )
