"""Per-account request capacity (issue 3 item 7, SPEC §6) in the real data plane: a full account
answers 429 `request-capacity-exhausted` with Retry-After at once, and every ending returns the
slot.

The data plane runs in this process (`tests/support/inprocess.py`) against the stub, where each
terminal row waits in the link's outbox for the test to read. Through both daemons and the v2
mint: `tests/system/test_dataplane_capacity.py`.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp

from tests.support.attempts import A_BODY, A_HEADERS, step
from tests.support.harness import Stub
from tests.support.inprocess import anthropic_plane
from tests.support.waits import until

ACCOUNT = "capped-anthropic"


async def test_request_capacity_429_and_every_ending_returns_the_slot(stub: Stub, tmp_path: Path) -> None:
    async with anthropic_plane(stub, tmp_path, ACCOUNT, request_capacity=1) as plane:
        url, proxy = plane.url, plane.proxy
        headers = {**A_HEADERS, "x-api-key": plane.token}
        async with aiohttp.ClientSession() as session:
            holder = await session.post(
                url, json={**A_BODY, "stream": True}, headers={**headers, **step(stall_after_events=3, stall_s=30)}
            )
            assert holder.status == 200
            await holder.content.readuntil(b"event: ping")
            assert proxy.capacity.count(ACCOUNT) == 1

            async with session.post(url, json=A_BODY, headers=headers) as refused:
                body = await refused.json()
                assert refused.status == 429 and refused.headers["retry-after"] == "1"
                assert body["error"]["type"] == "rate_limit_error"
                assert body["error"]["code"] == "request-capacity-exhausted"
                assert refused.headers["request-id"] == body["request_id"]

            holder.close()  # the worker goes away: the slot comes back with the aborted attempt
            await until(
                lambda: proxy.capacity.count(ACCOUNT) == 0 and not proxy.in_flight,
                10,
                "the aborted stream's slot returned",
            )
            async with session.post(url, json=A_BODY, headers=headers) as served:
                assert served.status == 200
            async with session.post(url, json=A_BODY, headers={**headers, **step(status=529)}) as failed:
                assert failed.status == 529
            async with session.post(url, json=A_BODY, headers=headers) as again:
                assert again.status == 200  # an upstream error returned its slot too
        await until(lambda: not proxy.in_flight, 10, "no attempt in flight")
    link = plane.link

    rows = list(link.outbox.values())
    assert [(r.status, r.refusal_reason, r.condition) for r in rows] == [
        ("refused", "request-capacity-exhausted", None),
        ("client-aborted", None, None),
        ("completed", None, None),
        ("upstream-error", None, "overloaded"),
        ("completed", None, None),
    ]
    assert rows[0].http_status == 429 and rows[0].retry_after_s == 1
    assert link.in_flight == {} and proxy.capacity.count(ACCOUNT) == 0
    assert len({r.attempt_id for r in rows}) == 5
