"""`GET /control/v2/traces/{attempt_id}` (scope `read`): the span of a recent attempt, as the
collector receives it (SPEC §21) — what `leaseholdctl trace` prints.

The span is planned from the row in the recent ring by the same pure function export uses
(`shared/spans.span_of`), so it is the same span whether or not export is on; `exported` says
whether this control sends it. The mint decision's events ride on the first attempt after it
and are already announced, so they are not shown here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import msgspec

from controlplane.http.appkeys import READS, TRACES
from controlplane.http.common import json_response, requires
from shared.codes import ErrorCode, Scope
from shared.errors import GatewayError
from shared.http1 import web
from shared.spans import DecisionNote, account_of, span_of

if TYPE_CHECKING:
    from controlplane.traces import Traces


@requires(Scope.READ)
async def trace_of_attempt(request: web.Request) -> web.Response:
    reads = request.app[READS]
    attempt_id = request.match_info["attempt_id"]
    row = next((r for r in reversed(reads.routes.recent) if r.attempt_id == attempt_id), None)
    if row is None:
        raise GatewayError(
            ErrorCode.NOT_FOUND,
            f"attempt {attempt_id[:64]!r} is not among the recent routes "
            f"(the last {reads.routes.recent.maxlen} finished attempts)",
        )
    traces = cast("Traces | None", request.app[TRACES])
    spec = reads.registry.get(row.account_id)
    account = None if spec is None else account_of(str(spec.provider_binding), spec.base_url)
    note = traces.notes.get(row.mint_decision_id) if traces is not None and row.mint_decision_id else None
    plan = span_of(row, account, None if note is None else DecisionNote(hop=note.hop))
    return json_response(
        {
            "exported": traces is not None,
            "resource": None if traces is None else traces.resource(),
            "span": msgspec.to_builtins(plan),
        }
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/control/v2/traces/{attempt_id}", trace_of_attempt)
