"""`leaseholdctl account enable|drain|disable|revoke-leases ID` and `leaseholdctl audit` (SPEC §9).

A mutation always carries `expected_revision`: given with `--expected-revision`, or read from
`GET /control/v2/accounts/admin` first — and then the CLI says so on stderr, because applying
"at whatever the revision is now" is a choice the operator should see. A 409 names the
revision the server holds. `audit --verify` exits 7 unless the chain reads verified or absent.
"""

from __future__ import annotations

import argparse
import getpass
from typing import Any

from controlplane.cli.client import Client
from controlplane.cli.exits import CtlError, Exit
from controlplane.cli.output import cell, emit, emit_json, render_table, warn
from shared.codes import AdminState, Scope

ADMIN_PATH = "/control/v2/accounts/admin"
AUDIT_PATH = "/control/v2/accounts/audit"
STATE_OF_ACTION: dict[str, AdminState] = {
    "enable": AdminState.ENABLED,
    "drain": AdminState.DRAINING,
    "disable": AdminState.DISABLED,
}
REVOKE_LEASES = "revoke-leases"
ACCEPTED_VERDICTS = ("verified", "absent")


def mutation_request(
    action: str, account_id: str, reason: str, actor: str | None, revision: int
) -> tuple[str, str, dict[str, Any]]:
    """(method, path, body) of one administrative mutation."""
    body: dict[str, Any] = {"reason": reason, "expected_revision": revision}
    if actor:
        body["actor"] = actor
    if action == REVOKE_LEASES:
        return "POST", f"/control/v2/accounts/{account_id}/revoke-leases", body
    return "PATCH", f"/control/v2/accounts/{account_id}/state", {"state": str(STATE_OF_ACTION[action]), **body}


def describe_mutation(action: str, account_id: str, payload: dict[str, Any]) -> str:
    revision = payload.get("revision")
    if action == REVOKE_LEASES:
        return f"{account_id}: revoked {cell(payload.get('revoked'))} lease(s); revision {revision}"
    return f"{account_id}: {STATE_OF_ACTION[action]}; revision {revision}"


def verdict_line(body: dict[str, Any]) -> str:
    line = f"chain {body.get('chain_verdict')}, revision {body.get('revision')}"
    return line + (f" ({body['chain_reason']})" if body.get("chain_reason") else "")


def audit_table(body: dict[str, Any]) -> str:
    records = body.get("records") or []
    rows = [
        (
            r.get("seq"),
            r.get("at"),
            r.get("account_id"),
            r.get("action"),
            r.get("state"),
            f"{cell(r.get('actor'))} (via {cell(r.get('actor_authenticated_by'))})",
            r.get("reason"),
        )
        for r in records
    ]
    table = (
        render_table(("SEQ", "AT", "ACCOUNT", "ACTION", "STATE", "ACTOR", "REASON"), rows)
        if rows
        else "no administrative record"
    )
    return verdict_line(body) + "\n" + table


def verify_exit(verdict: Any) -> Exit:
    return Exit.OK if verdict in ACCEPTED_VERDICTS else Exit.UNVERIFIED


def default_actor() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def current_revision(client: Client, path: str, what: str) -> int:
    """Read the revision now and say so: the mutation will be checked against it."""
    revision = client.get(path, Scope.READ).get("revision")
    if not isinstance(revision, int):
        raise CtlError(Exit.FAILED, f"{path} did not report a revision")
    warn(f"using current revision {revision} of the {what} (pass --expected-revision to pin it)")
    return revision


def run_account(args: argparse.Namespace, client: Client) -> int:
    revision = args.expected_revision
    if revision is None:
        revision = current_revision(client, ADMIN_PATH, "administrative overlay")
    method, path, body = mutation_request(
        args.action, args.account_id, args.reason, args.actor or default_actor(), revision
    )
    payload = client.expect(client.call(method, path, body), Scope.ADMIN, path)
    emit_json(payload) if args.json else emit(describe_mutation(args.action, args.account_id, payload))
    return Exit.OK


def run_audit(args: argparse.Namespace, client: Client) -> int:
    body = client.get(AUDIT_PATH, Scope.READ)
    emit_json(body) if args.json else emit(audit_table(body))
    if not args.verify:
        return Exit.OK
    code = verify_exit(body.get("chain_verdict"))
    if code != Exit.OK:
        warn(f"the administrative chain does not verify: {verdict_line(body)}")
    return code


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "account",
        parents=[common],
        help="enable, drain or disable an account, or revoke its leases",
        description="Append one record to the administrative chain (scope admin). Without "
        "--expected-revision the current revision is read first and reported.",
    )
    p.add_argument("action", choices=[*STATE_OF_ACTION, REVOKE_LEASES])
    p.add_argument("account_id", metavar="ID")
    p.add_argument("--reason", required=True, help="why (recorded forever)")
    p.add_argument("--actor", help="who (recorded as your claim; default: your login name)")
    p.add_argument("--expected-revision", type=int, metavar="N", help="refuse (409) unless the chain is at N")
    p.set_defaults(run=run_account)

    p = sub.add_parser("audit", parents=[common], help="the administrative chain and its verdict")
    p.add_argument("--verify", action="store_true", help="exit 7 unless the verdict is verified or absent")
    p.set_defaults(run=run_audit)
