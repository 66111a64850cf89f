"""`leaseholdctl trace ATTEMPT_ID` (SPEC §21, scope `read`): one recent attempt's span, drawn as
a trace viewer shows it — the caller's span (when the request carried a `traceparent`) with the
attempt's CLIENT span under it, its duration, status, attributes and events.

The span comes from `GET /control/v2/traces/{attempt_id}`, planned from the row by the function
export uses, so this is what the collector received (when `exported`); the rendering is pure.
"""

from __future__ import annotations

import argparse
from typing import Any

from controlplane.cli.client import Client
from controlplane.cli.exits import Exit
from controlplane.cli.output import emit, emit_json
from shared.codes import Scope

TRACE_PATH = "/control/v2/traces/"
ATTRIBUTE_ORDER = ("gen_ai.", "server.", "http.", "error.", "leasehold.")


def _value(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return repr(value) if isinstance(value, str) else str(value)


def _attributes(attributes: dict[str, Any], indent: str) -> list[str]:
    ranked = sorted(
        attributes,
        key=lambda k: (next((i for i, p in enumerate(ATTRIBUTE_ORDER) if k.startswith(p)), len(ATTRIBUTE_ORDER)), k),
    )
    return [f"{indent}{key} = {_value(attributes[key])}" for key in ranked]


def trace_text(answer: dict[str, Any]) -> str:
    """The tree: trace id, the caller's span (if any), the attempt's span and its details."""
    span = answer["span"]
    parent = span.get("parent")
    seconds = (span["end_ns"] - span["start_ns"]) / 1e9
    status = f"ERROR {span['error_type']}" if span.get("error_type") else "OK"
    lines = [
        f"trace {span['trace_id']}"
        + ("" if answer.get("exported") else "   (export is off: no collector received this)")
    ]
    indent = ""
    if parent is not None:
        lines.append(f"└─ span {parent['span_id']}   the caller's (from its traceparent; not Leasehold's)")
        indent = "   "
    lines.append(f"{indent}└─ {span['name']}   CLIENT   {seconds:.3f} s   {status}   span {span['span_id']}")
    detail = indent + "      "
    lines += _attributes(span["attributes"], detail)
    for event in span.get("events") or ():
        lines.append(f"{detail}event {event['name']}")
        lines += _attributes(event.get("attributes") or {}, detail + "  ")
    resource = answer.get("resource")
    if resource:
        lines.append("resource: " + ", ".join(f"{k}={v}" for k, v in sorted(resource.items())))
    return "\n".join(lines)


def run_trace(args: argparse.Namespace, client: Client) -> int:
    answer = client.get(TRACE_PATH + args.attempt_id, Scope.READ)
    emit_json(answer) if args.json else emit(trace_text(answer))
    return Exit.OK


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("trace", parents=[common], help="a recent attempt's span, as the collector shows it")
    p.add_argument("attempt_id", metavar="ATTEMPT_ID")
    p.set_defaults(run=run_trace)
