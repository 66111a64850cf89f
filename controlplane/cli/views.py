"""`leaseholdctl accounts | routes | watch | events` (SPEC §11, scope `read`).

Each fact of an account gets its own column (configured, administrative state, leases, in
flight, observed, circuit, health with its reason) — one is never inferred from another, and an
absent value prints "-", not a blank. `watch` redraws the same view every second with plain ANSI
and says so when the control daemon is unreachable rather than showing an empty table.
`events` prints the SSE feed as JSON lines and resumes with `Last-Event-ID` after a drop.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import time
from typing import Any

from controlplane.cli.client import Client
from controlplane.cli.exits import CtlError, Exit
from controlplane.cli.output import cell, emit, emit_json, hhmmss, render_table, warn
from shared.codes import CircuitPhase, Scope

ACCOUNTS_PATH = "/control/v2/accounts"
ACTIVE_PATH = "/control/v2/routes/active"
RECENT_PATH = "/control/v2/routes/recent"
ADMIN_PATH = "/control/v2/accounts/admin"
EVENTS_PATH = "/control/v2/events"
CLEAR = "\x1b[H\x1b[2J"
EVENTS_READ_TIMEOUT_S = 90.0  # longer than any heartbeat interval: silence means a dead link
RECONNECT_BACKOFF_S = (0.5, 5.0)  # first wait, ceiling

# ---- formatting (pure) --------------------------------------------------------------------

ACCOUNT_HEADERS = (
    "ID",
    "BINDING",
    "CONFIGURED",
    "ADMIN",
    "LEASES",
    "IN FLIGHT",
    "OBSERVED",
    "CIRCUIT",
    "HEALTH",
    "HEADROOM",
)


def circuit_text(circuit: dict[str, Any] | None) -> str:
    if not circuit:
        return "-"
    state = circuit.get("state")
    if state == CircuitPhase.CLOSED:
        return str(state)
    text = str(state)
    if state == CircuitPhase.OPEN and circuit.get("retry_at"):
        text += f" until {hhmmss(circuit['retry_at'])}"
    return text + (f" ({circuit['opened_by']})" if circuit.get("opened_by") else "")


def observed_text(account: dict[str, Any]) -> str:
    count = account.get("observed_request_count", 0)
    aborted = account.get("observed_aborted_count", 0)
    return f"{count} ({aborted} aborted)" if aborted else str(count)


def headroom_text(rate_limits: dict[str, Any] | None) -> str:
    """The account's lowest current provider headroom (SPEC §22): `4% tokens, resets 10:05:00Z`;
    `-` when no kind the provider reported can be judged now (none, or its reset passed)."""
    judged = [
        (kind, limit)
        for kind, limit in (rate_limits or {}).items()
        if isinstance(limit, dict) and limit.get("current") and limit.get("headroom_percent") is not None
    ]
    if not judged:
        return "-"
    kind, lowest = min(judged, key=lambda item: item[1]["headroom_percent"])
    return f"{lowest['headroom_percent']:g}% {kind}, resets {hhmmss(lowest.get('reset_at'))}"


def accounts_table(view: dict[str, Any]) -> str:
    rows = [
        (
            a.get("id"),
            a.get("provider_binding"),
            a.get("configured"),
            a.get("administrative_state"),
            a.get("lease_count"),
            a.get("in_flight_count"),
            observed_text(a),
            circuit_text(a.get("circuit")),
            f"{a.get('health')} ({a.get('health_reason')})",
            headroom_text(a.get("rate_limits")),
        )
        for a in view.get("accounts", [])
    ]
    footer = (
        f"window {cell(view.get('window_seconds'))}s, as of {cell(view.get('as_of'))}, "
        f"evidence since {cell(view.get('evidence_since'))}"
    )
    if view.get("evidence_truncated"):
        footer += " (evidence truncated: the window reaches past what is retained)"
    return render_table(ACCOUNT_HEADERS, rows) + "\n" + footer


def _tokens(usage: dict[str, Any] | None) -> str:
    if not usage:
        return "-"
    return f"{usage.get('input_tokens', 0)}/{usage.get('output_tokens', 0)}"


FINISHED_HEADERS: tuple[str, ...] = (
    "STARTED",
    "ATTEMPT",
    "ACCOUNT",
    "REPO",
    "PATH",
    "MODEL",
    "STATUS",
    "HTTP",
    "CODE",
    "TOKENS IN/OUT",
    "COST USD",
    "OVERHEAD MS",
)
ACTIVE_HEADERS: tuple[str, ...] = (
    "STARTED",
    "ATTEMPT",
    "ACCOUNT",
    "KEY",
    "REPO",
    "PRINCIPAL",
    "PATH",
    "MODEL",
    "STREAM",
)


def _finished_row(r: dict[str, Any]) -> tuple[Any, ...]:
    return (
        hhmmss(r.get("started_at")),
        r.get("attempt_id"),
        r.get("account_id"),
        r.get("repo_slug"),
        r.get("path"),
        r.get("served_model") or r.get("requested_model"),
        r.get("status"),
        r.get("http_status"),
        r.get("condition") or r.get("refusal_reason"),
        _tokens(r.get("usage")),
        r.get("cost_usd") if r.get("cost_usd") is not None else r.get("cost_reason"),
        r.get("overhead_ms"),
    )


def _active_row(r: dict[str, Any]) -> tuple[Any, ...]:
    return (
        hhmmss(r.get("started_at")),
        r.get("attempt_id"),
        r.get("account_id"),
        r.get("key_id"),
        r.get("repo_slug"),
        r.get("principal_id"),
        r.get("path"),
        r.get("requested_model"),
        r.get("stream"),
    )


def routes_table(view: dict[str, Any], *, finished: bool) -> str:
    routes = view.get("routes", [])
    if finished:
        headers, rows = FINISHED_HEADERS, [_finished_row(r) for r in routes]
        footer = (
            f"{len(routes)} shown of {cell(view.get('retained'))} retained, "
            f"evidence since {cell(view.get('evidence_since'))}"
        )
        if view.get("truncated"):
            footer += " (truncated: older routes exist; raise --limit up to 200)"
    else:
        headers, rows = ACTIVE_HEADERS, [_active_row(r) for r in routes]
        footer = f"{len(routes)} active"
        if view.get("dataplane_connected") is False:
            footer += " (the data plane is NOT connected: nothing can be in flight)"
    if not routes:
        return ("no route recorded yet" if finished else "no route in flight") + "\n" + footer
    return render_table(headers, rows) + "\n" + footer


def admin_line(admin: dict[str, Any] | None) -> str:
    if admin is None:
        return "admin chain: not served by this control daemon"
    line = f"admin chain: {admin.get('chain_verdict')}, revision {admin.get('revision')}"
    return line + (f" ({admin['chain_reason']})" if admin.get("chain_reason") else "")


def watch_frame(
    url: str,
    accounts: dict[str, Any] | None,
    active: dict[str, Any] | None,
    admin: dict[str, Any] | None,
    problem: str | None,
    now: str,
) -> str:
    head = f"leasehold @ {url}   {now}   (Ctrl-C to quit)"
    if problem is not None:
        return f"{head}\n\n{problem}\nretrying every refresh; nothing below this line is known."
    assert accounts is not None and active is not None
    return "\n\n".join(
        [head, accounts_table(accounts), admin_line(admin), "ROUTES IN FLIGHT\n" + routes_table(active, finished=False)]
    )


class SseParser:
    """Server-sent events, line by line (WHATWG rules: `field: value`, blank line dispatches)."""

    def __init__(self) -> None:
        self._id: str | None = None
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, line: str) -> dict[str, Any] | None:
        line = line.rstrip("\r\n")
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment: heartbeats
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id":
            self._id = value
        elif name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None

    def _dispatch(self) -> dict[str, Any] | None:
        if not self._data and self._event is None:
            return None
        raw = "\n".join(self._data)
        try:
            data: Any = json.loads(raw)
        except ValueError:
            data = raw
        event = {"id": self._id, "event": self._event or "message", "data": data}
        self._event, self._data = None, []
        return event


# ---- commands -----------------------------------------------------------------------------


def run_accounts(args: argparse.Namespace, client: Client) -> int:
    view = client.get(ACCOUNTS_PATH, Scope.READ, {"window_seconds": args.window})
    emit_json(view) if args.json else emit(accounts_table(view))
    return Exit.OK


def run_routes(args: argparse.Namespace, client: Client) -> int:
    if args.recent:
        view = client.get(RECENT_PATH, Scope.READ, {"limit": args.limit})
    else:
        if args.limit is not None:
            raise CtlError(Exit.USAGE, "--limit applies to --recent")
        view = client.get(ACTIVE_PATH, Scope.READ)
    emit_json(view) if args.json else emit(routes_table(view, finished=args.recent))
    return Exit.OK


def _admin_or_none(client: Client) -> dict[str, Any] | None:
    reply = client.call("GET", ADMIN_PATH)
    return None if reply.status == 404 else client.expect(reply, Scope.READ, ADMIN_PATH)


def run_watch(args: argparse.Namespace, client: Client) -> int:
    clear = CLEAR if sys.stdout.isatty() else "\n"
    frames = 0
    try:
        while True:
            accounts = active = admin = problem = None
            try:
                accounts = client.get(ACCOUNTS_PATH, Scope.READ, {"window_seconds": args.window})
                active = client.get(ACTIVE_PATH, Scope.READ)
                admin = _admin_or_none(client)
            except CtlError as exc:
                if exc.code != Exit.UNREACHABLE:
                    raise
                problem = exc.message
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            print(clear + watch_frame(client.url, accounts, active, admin, problem, now), flush=True)
            frames += 1
            if args.count and frames >= args.count:
                return Exit.OK
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return Exit.OK


def run_events(args: argparse.Namespace, client: Client) -> int:
    last_id: str | None = args.last_event_id
    printed, connected_once = 0, False
    backoff = RECONNECT_BACKOFF_S[0]
    while True:
        headers = {"Accept": "text/event-stream"}
        if last_id is not None:
            headers["Last-Event-ID"] = last_id
        try:
            with client.stream(EVENTS_PATH, Scope.READ, headers, EVENTS_READ_TIMEOUT_S) as response:
                connected_once, backoff = True, RECONNECT_BACKOFF_S[0]
                warn(
                    f"connected to {client.url}{EVENTS_PATH}"
                    + (f", resuming after id {last_id}" if last_id is not None else "")
                )
                parser = SseParser()
                for raw in response:
                    event = parser.feed(raw.decode("utf-8", "replace"))
                    if event is None:
                        continue
                    print(json.dumps(event, separators=(",", ":")), flush=True)
                    last_id = event["id"] if event["id"] is not None else last_id
                    printed += 1
                    if args.max_events and printed >= args.max_events:
                        return Exit.OK
        except CtlError as exc:
            if exc.code != Exit.UNREACHABLE or not connected_once or args.no_reconnect:
                raise
        except (OSError, http.client.HTTPException):
            pass  # the feed dropped mid-stream: resume below
        except KeyboardInterrupt:
            return Exit.OK
        if args.no_reconnect:
            raise CtlError(Exit.FAILED, "the event feed ended")
        warn(f"event feed dropped; reconnecting in {backoff:g}s from id {last_id}")
        time.sleep(backoff)
        backoff = min(backoff * 2, RECONNECT_BACKOFF_S[1])


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("accounts", parents=[common], help="every account and each of its facts")
    p.add_argument("--window", type=int, metavar="S", help="evidence window in seconds (60..86400)")
    p.set_defaults(run=run_accounts)

    p = sub.add_parser("routes", parents=[common], help="routes in flight (default) or recent")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--active", action="store_true", help="attempts in flight (default)")
    which.add_argument("--recent", action="store_true", help="finished attempts, newest first")
    p.add_argument("--limit", type=int, metavar="N", help="recent routes to show (1..200, default 50)")
    p.set_defaults(run=run_routes)

    p = sub.add_parser("watch", parents=[common], help="a refreshing terminal view of accounts and routes")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between refreshes")
    p.add_argument("--window", type=int, metavar="S", help="evidence window in seconds")
    p.add_argument("--count", type=int, default=0, metavar="N", help="stop after N refreshes (0 = never)")
    p.set_defaults(run=run_watch)

    p = sub.add_parser("events", parents=[common], help="the raw event feed as JSON lines")
    p.add_argument("--last-event-id", metavar="ID", help="resume after this event id")
    p.add_argument("--max-events", type=int, default=0, metavar="N", help="stop after N events (0 = never)")
    p.add_argument("--no-reconnect", action="store_true", help="exit when the feed drops")
    p.set_defaults(run=run_events)
