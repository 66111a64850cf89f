"""`leaseholdctl policy get | set | explain | audit` (SPEC §10).

`set` reads a level document from a `.toml` or `.json` file and writes it with
`PUT /control/v2/policy/level` `{name, expected_revision, document, reason}` (scope `admin`);
without `--expected-revision` it reads the current revision first and says so. `explain` is the
dry run of a mint: resolved policy, provenance, candidates with live filter codes, selection.

The human renderings read the fields SPEC §10 names and stay tolerant of extra or differently
nested ones (`--json` always prints the answer as it came), so a richer server never breaks them.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path
from typing import Any

from controlplane.cli.admin import current_revision, default_actor, verdict_line, verify_exit
from controlplane.cli.client import Client
from controlplane.cli.exits import CtlError, Exit
from controlplane.cli.output import cell, emit, emit_json, render_pairs, render_table, warn
from controlplane.cli.spend import budget_rows
from shared.codes import Scope

POLICY_PATH = "/control/v2/policy"
LEVEL_PATH = "/control/v2/policy/level"
EXPLAIN_PATH = "/control/v2/policy/explain"
AUDIT_PATH = "/control/v2/policy/audit"


def load_document(path: str) -> dict[str, Any]:
    """A level document from a TOML or JSON file (by extension); USAGE on anything else."""
    suffix = Path(path).suffix.lower()
    if suffix not in (".toml", ".json"):
        raise CtlError(Exit.USAGE, f"{path}: name the format by extension, .toml or .json")
    try:
        raw = Path(path).read_bytes()
        document = tomllib.loads(raw.decode()) if suffix == ".toml" else json.loads(raw)
    except OSError as exc:
        raise CtlError(Exit.USAGE, f"{path}: cannot read: {exc.strerror}") from None
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise CtlError(Exit.USAGE, f"{path}: not valid {suffix[1:].upper()}: {exc}") from None
    if not isinstance(document, dict):
        raise CtlError(Exit.USAGE, f"{path}: a level document is a table/object of fields")
    return document


def _levels(body: dict[str, Any]) -> list[tuple[str, Any]]:
    levels = body.get("levels") or {}
    if isinstance(levels, dict):
        return list(levels.items())
    return [(str(item.get("name")), item.get("document")) for item in levels if isinstance(item, dict)]


def describe_policy(body: dict[str, Any]) -> str:
    parts = [verdict_line(body)]
    levels = _levels(body)
    if body.get("levels", {}) is None:
        parts.append("level documents withheld: the policy chain cannot be believed")
    elif not levels:
        parts.append("no level document: the registry order and the platform ceilings decide")
    for name, document in levels:
        parts.append(f"[{name}]\n{json.dumps(document, indent=2, sort_keys=True)}")
    return "\n\n".join(parts)


def describe_level(name: str, body: dict[str, Any]) -> str:
    document = body.get("document", body)
    written = body.get("written_at_revision")
    head = f"[{body.get('name', name)}] " + (
        f"written at revision {written}" if written is not None else f"policy revision {cell(body.get('revision'))}"
    )
    return (
        head
        + "\n"
        + (json.dumps(document, indent=2, sort_keys=True) if document is not None else "no document at this level")
    )


def _field_line(field: str, value: Any, body: dict[str, Any]) -> tuple[str, str]:
    source = (body.get("provenance") or {}).get(field, "default")
    notes = [f"from {source}"]
    locked = (body.get("locked_by") or {}).get(field)
    if locked:
        notes.append(f"locked at {locked}")
    vetoed = (body.get("vetoed") or {}).get(field)
    if vetoed:
        notes.append("vetoed: " + ", ".join(vetoed if isinstance(vetoed, list) else [str(vetoed)]))
    return field, f"{cell(value)}  ({'; '.join(notes)})"


def _tenancy_text(tenancy: Any) -> str:
    if not isinstance(tenancy, dict):
        return "tenancy unknown"
    levels = [f"{lv.get('name')}{'' if lv.get('present') else ' (empty)'}" for lv in tenancy.get("levels") or []]
    return f"team {cell(tenancy.get('team'))}, org {cell(tenancy.get('org'))}; levels " + (
        " < ".join(levels) if levels else "-"
    )


def describe_explain(body: dict[str, Any]) -> str:
    resolved = body.get("resolved") or body.get("policy") or {}
    fields = [_field_line(field, value, body) for field, value in resolved.items() if field != "provenance"]
    candidates = body.get("candidates")
    rows = [
        (c.get("position"), c.get("account_id"), c.get("provider_binding"), c.get("effective_model"), _codes(c))
        for c in candidates or []
    ]
    if rows:
        listing = render_table(("POS", "ACCOUNT", "BINDING", "MODEL", "LIVE FILTERS"), rows)
    elif candidates is None and "candidates" in body:
        listing = "no candidate list: the policy cannot be resolved now"
    else:
        listing = "no candidate serves this model"
    selection = next((body[k] for k in ("would_select", "selection", "selected") if k in body), None)
    head = f"policy revision {cell(body.get('policy_revision', body.get('revision')))}"
    if body.get("chain_verdict"):
        head += f", chain {body['chain_verdict']}" + (f" ({body['chain_reason']})" if body.get("chain_reason") else "")
    if "tenancy" in body:
        head += "\n" + _tenancy_text(body["tenancy"])
    parts = [
        head,
        render_pairs(fields) if fields else "no resolved policy",
        listing,
        f"a mint now would select: {_selection_text(selection)}",
    ]
    if body.get("budgets"):
        parts.append("BUDGETS ON THIS CHAIN (each for its own level)\n" + budget_rows(body["budgets"]))
    return "\n\n".join(parts)


def _codes(candidate: dict[str, Any]) -> str:
    for key in ("filters", "codes", "code", "skip"):
        value = candidate.get(key)
        if value:
            return ", ".join(value) if isinstance(value, list) else str(value)
    return "eligible"


def _selection_text(selection: Any) -> str:
    if isinstance(selection, dict):
        account = selection.get("account_id")
        if account:
            return f"{account} (position {cell(selection.get('position', selection.get('fallback_position')))})"
        return f"nothing: {cell(selection.get('refusal_reason') or selection.get('outcome'))}"
    return cell(selection)


def audit_table(body: dict[str, Any]) -> str:
    records = body.get("records") or []
    rows = [
        (r.get("seq"), r.get("at"), r.get("name", r.get("level")), r.get("actor"), r.get("reason")) for r in records
    ]
    table = render_table(("SEQ", "AT", "LEVEL", "ACTOR", "REASON"), rows) if rows else "no policy record"
    return verdict_line(body) + "\n" + table


# ---- commands -----------------------------------------------------------------------------


def run_get(args: argparse.Namespace, client: Client) -> int:
    if args.level:
        body = client.get(LEVEL_PATH, Scope.READ, {"name": args.level})
        emit_json(body) if args.json else emit(describe_level(args.level, body))
    else:
        body = client.get(POLICY_PATH, Scope.READ)
        emit_json(body) if args.json else emit(describe_policy(body))
    return Exit.OK


def run_set(args: argparse.Namespace, client: Client) -> int:
    document = load_document(args.file)
    revision = args.expected_revision
    if revision is None:
        revision = current_revision(client, POLICY_PATH, "policy chain")
    body = {"name": args.level, "expected_revision": revision, "document": document, "reason": args.reason}
    actor = args.actor or default_actor()
    if actor:
        body["actor"] = actor
    payload = client.expect(client.call("PUT", LEVEL_PATH, body), Scope.ADMIN, LEVEL_PATH)
    emit_json(payload) if args.json else emit(f"{args.level}: written; policy revision {cell(payload.get('revision'))}")
    return Exit.OK


def run_explain(args: argparse.Namespace, client: Client) -> int:
    if (args.model is None) == (args.model_class is None):
        raise CtlError(Exit.USAGE, "explain needs exactly one of --model or --model-class")
    query = {"repo_slug": args.repo, "worker_role": args.role, "model": args.model, "model_class": args.model_class}
    body = client.get(EXPLAIN_PATH, Scope.READ, query)
    emit_json(body) if args.json else emit(describe_explain(body))
    return Exit.OK


def run_audit(args: argparse.Namespace, client: Client) -> int:
    body = client.get(AUDIT_PATH, Scope.READ)
    emit_json(body) if args.json else emit(audit_table(body))
    code = verify_exit(body.get("chain_verdict")) if args.verify else Exit.OK
    if code != Exit.OK:
        warn(f"the policy chain does not verify: {verdict_line(body)}")
    return code


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    policy = sub.add_parser("policy", help="the routing policy: get, set, explain, audit")
    verbs = policy.add_subparsers(dest="verb", metavar="VERB", required=True)

    p = verbs.add_parser("get", parents=[common], help="every level (or one level) of the policy")
    p.add_argument("--level", metavar="NAME", help="platform, org:ID, team:ID, repo:SLUG or binding:SLUG#ROLE")
    p.set_defaults(run=run_get)

    p = verbs.add_parser("set", parents=[common], help="write one level document (scope admin)")
    p.add_argument("--level", required=True, metavar="NAME")
    p.add_argument("--file", required=True, help="the document, .toml or .json")
    p.add_argument("--reason", required=True, help="why (recorded forever)")
    p.add_argument("--actor", help="who (recorded as your claim; default: your login name)")
    p.add_argument("--expected-revision", type=int, metavar="N", help="refuse (409) unless the chain is at N")
    p.set_defaults(run=run_set)

    p = verbs.add_parser("explain", parents=[common], help="what a mint would resolve and select now")
    p.add_argument("--repo", required=True, help="repo_slug")
    p.add_argument("--role", help="worker_role")
    model = p.add_mutually_exclusive_group()
    model.add_argument("--model")
    model.add_argument("--model-class")
    p.set_defaults(run=run_explain)

    p = verbs.add_parser("audit", parents=[common], help="the policy chain and its verdict")
    p.add_argument("--verify", action="store_true", help="exit 7 unless the verdict is verified or absent")
    p.set_defaults(run=run_audit)
