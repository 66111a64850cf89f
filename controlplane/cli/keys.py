"""`leaseholdctl mint | revoke | renew` (SPEC §5, scope `mint`).

`mint` is the v1 legacy lane (`--binding`) or, with `--v2`, identity and intent: the gateway
chooses the account. A v2 answer is one of three outcomes and the exit code says which:
selected 0, held 3 (with the server's Retry-After), rejected 4. A v1 mint held 503 (a budget of
its scope exhausted, the account at its lease capacity) exits 3 as well.
"""

from __future__ import annotations

import argparse
from typing import Any

from controlplane.cli.client import Client, Reply, error_of, failure_of
from controlplane.cli.exits import CtlError, Exit
from controlplane.cli.output import emit, emit_json, render_pairs, skipped_text, warn
from shared.codes import Binding, Outcome, Scope

V1_PATH = "/control/v1/keys"
V2_PATH = "/control/v2/mint"
V2_ONLY = ("dispatch", "role", "model", "model_class", "retry_of", "supersedes")


def mint_request(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The route and body a `mint` invocation asks for; a `CtlError(USAGE)` when flags clash."""
    if not args.v2:
        given = [f"--{name.replace('_', '-')}" for name in V2_ONLY if getattr(args, name) is not None]
        if given:
            raise CtlError(Exit.USAGE, f"{', '.join(given)} need --v2 (the v1 lane takes --binding)")
        if args.binding is None:
            raise CtlError(Exit.USAGE, "mint needs --binding (v1) or --v2 with --dispatch and --model/--model-class")
        body = {
            "provider_binding": args.binding,
            "principal_kind": args.principal_kind,
            "principal_id": args.principal,
            "repo_slug": args.repo,
        }
        if args.ttl is not None:
            body["ttl_seconds"] = args.ttl
        return V1_PATH, body
    if args.binding is not None:
        raise CtlError(Exit.USAGE, "--binding is the v1 lane; a v2 mint never names a binding or an account")
    if args.dispatch is None:
        raise CtlError(Exit.USAGE, "mint --v2 needs --dispatch")
    if (args.model is None) == (args.model_class is None):
        raise CtlError(Exit.USAGE, "mint --v2 needs exactly one of --model or --model-class")
    return V2_PATH, v2_body(
        args.dispatch,
        args.repo,
        args.principal_kind,
        args.principal,
        role=args.role,
        model=args.model,
        model_class=args.model_class,
        ttl=args.ttl,
        retry_of=args.retry_of,
        supersedes=args.supersedes,
    )


def v2_body(
    dispatch: str,
    repo: str,
    principal_kind: str,
    principal: str,
    *,
    role: str | None,
    model: str | None,
    model_class: str | None,
    ttl: int | None,
    retry_of: str | None = None,
    supersedes: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "dispatch_id": dispatch,
        "repo_slug": repo,
        "principal_kind": principal_kind,
        "principal_id": principal,
    }
    optional = {
        "worker_role": role,
        "model": model,
        "model_class": model_class,
        "ttl_seconds": ttl,
        "retry_of_mint_decision_id": retry_of,
        "supersedes_mint_decision_id": supersedes,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    return body


def describe_v1(body: dict[str, Any]) -> str:
    return render_pairs(
        [
            ("account", body.get("account_id")),
            ("key_id", body.get("key_id")),
            ("token", body.get("token")),
            ("base_url", body.get("base_url")),
            ("expires_at", body.get("expires_at")),
        ]
    )


def describe_v2(body: dict[str, Any], retry_after: str | None) -> str:
    """The human lines of a v2 mint or renew answer, whatever its outcome."""
    outcome = body.get("outcome")
    if outcome == Outcome.SELECTED:
        where = f"{body.get('account_id')} (position {body.get('fallback_position')}, hop {body.get('hop')})"
        pairs = [
            ("outcome", outcome),
            ("account", where),
            ("key_id", body.get("key_id")),
            ("token", body.get("token")),
            ("base_url", body.get("base_url")),
            ("expires_at", body.get("expires_at")),
            ("model", body.get("effective_model")),
            ("decision", body.get("mint_decision_id")),
            ("policy", _revision(body.get("policy_revision"))),
            ("skipped", skipped_text(body.get("skipped"))),
        ]
    else:
        pairs = [
            ("outcome", outcome),
            ("refusal", body.get("refusal_reason")),
            ("decision", body.get("mint_decision_id")),
            ("skipped", skipped_text(body.get("skipped"))),
        ]
        if outcome == Outcome.HELD:
            pairs.append(("Retry-After", retry_after))
    return render_pairs(pairs)


def _revision(value: Any) -> str | None:
    return None if value is None else f"revision {value}"


def v2_exit(reply: Reply) -> Exit | None:
    """The exit code of a v2 outcome, or None when the answer is not a mint outcome at all."""
    outcome: Any = reply.body.get("outcome") if isinstance(reply.body, dict) else None
    return {Outcome.SELECTED: Exit.OK, Outcome.HELD: Exit.HELD, Outcome.REJECTED: Exit.REJECTED}.get(outcome)


def report_v2(client: Client, reply: Reply, path: str, as_json: bool) -> int:
    code = v2_exit(reply)
    if code is None:
        raise failure_of(reply, Scope.MINT, client.token, path)
    if as_json:
        emit_json(reply.body)
    else:
        emit(describe_v2(reply.body, reply.headers.get("retry-after")))
    return code


# ---- commands ---------------------------------------------------------------------------


def run_mint(args: argparse.Namespace, client: Client) -> int:
    path, body = mint_request(args)
    reply = client.call("POST", path, body)
    if path == V2_PATH:
        return report_v2(client, reply, path, args.json)
    if reply.status == 503:  # held (a budget of the scope exhausted, the account full): come back later
        code, message, _ = error_of(reply.body)
        raise CtlError(
            Exit.HELD, f"mint held (503 {code}): {message}; Retry-After {reply.headers.get('retry-after', '?')} s"
        )
    payload = client.expect(reply, Scope.MINT, path)
    emit_json(payload) if args.json else emit(describe_v1(payload))
    return Exit.OK


def run_revoke(args: argparse.Namespace, client: Client) -> int:
    path = f"/control/v1/keys/{args.key_id}"
    payload = client.expect(client.call("DELETE", path), Scope.MINT, path)
    if args.json:
        emit_json(payload)
    elif payload.get("revoked"):
        emit(f"revoked {args.key_id}")
    else:
        emit(f"{args.key_id} was not live (already revoked or expired): nothing to do")
    return Exit.OK


def run_renew(args: argparse.Namespace, client: Client) -> int:
    path = f"/control/v2/keys/{args.key_id}/renew"
    body = {} if args.ttl is None else {"ttl_seconds": args.ttl}
    code = report_v2(client, client.call("POST", path, body), path, args.json)
    if code == Exit.OK and args.revoke_old:
        old = f"/control/v1/keys/{args.key_id}"
        client.expect(client.call("DELETE", old), Scope.MINT, old)
        if not args.json:
            warn(f"revoked the predecessor {args.key_id}")
    return code


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "mint",
        parents=[common],
        help="mint a lease (v1 by binding, or --v2 by intent)",
        description="Mint a virtual key. v1: --binding. v2: --v2 --dispatch and "
        "--model or --model-class; exit 0 selected, 3 held, 4 rejected.",
    )
    p.add_argument("--v2", action="store_true", help="identity and intent: the gateway picks the account")
    p.add_argument("--binding", choices=[str(b) for b in Binding], help="v1 legacy lane binding")
    p.add_argument("--principal", required=True, help="principal_id")
    p.add_argument("--principal-kind", default="worker", help="principal_kind (default worker)")
    p.add_argument("--repo", required=True, help="repo_slug")
    p.add_argument("--ttl", type=int, help="ttl_seconds (60..86400)")
    p.add_argument("--dispatch", help="dispatch_id (v2)")
    p.add_argument("--role", help="worker_role (v2)")
    model = p.add_mutually_exclusive_group()
    model.add_argument("--model", help="model (v2)")
    model.add_argument("--model-class", help="model_class (v2)")
    cite = p.add_mutually_exclusive_group()
    cite.add_argument("--retry-of", metavar="DECISION_ID", help="retry_of_mint_decision_id (v2 fallback)")
    cite.add_argument("--supersedes", metavar="DECISION_ID", help="supersedes_mint_decision_id (v2)")
    p.set_defaults(run=run_mint)

    p = sub.add_parser("revoke", parents=[common], help="revoke a lease (idempotent)")
    p.add_argument("key_id", metavar="KEY_ID")
    p.set_defaults(run=run_revoke)

    p = sub.add_parser(
        "renew",
        parents=[common],
        help="mint a successor of a v2 lease (same account)",
        description="Mint a successor on the same account and position; the old key "
        "stays live until revoked (--revoke-old does it after a selected renew).",
    )
    p.add_argument("key_id", metavar="KEY_ID")
    p.add_argument("--ttl", type=int, help="ttl_seconds of the successor")
    p.add_argument("--revoke-old", action="store_true", help="revoke KEY_ID once the successor is selected")
    p.set_defaults(run=run_renew)
