"""The dashboard shows a dispatch's hops (SPEC §17) as they happen, in headless Chromium."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.harness import credential_like, http
from tests.system.test_dashboard import ARTIFACTS, WAIT_MS, browser, open_dashboard, page  # noqa: F401 (fixtures)
from tests.system.test_dispatch_keys import MODEL, A, B, mint, pool, second_stub  # noqa: F401 (fixture)


def test_a_hop_appears_with_its_accounts_condition_and_decision(
    page: Any, make_gateway, tmp_path: Path, clean_stub, second_stub
) -> None:
    read_token = credential_like("read_")
    gw = pool(make_gateway, tmp_path, second_stub, {"GATEWAY_READ_TOKEN": read_token})
    open_dashboard(page, gw, read_token)
    assert "no hop since this page connected" in page.text_content("#hops")
    minted = mint(gw)
    status, _, _ = http(
        "POST",
        gw.dataplane_url + "/v1/messages",
        {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        {"x-api-key": minted["token"], "x-stub-step": '{"status": 429, "headers": {"retry-after": "1"}}'},
    )
    assert status == 429
    row = page.wait_for_selector(f"#hops tr[data-key='{minted['key_id']}']", timeout=WAIT_MS)
    shown = {f: row.query_selector(f"[data-field={f}]").text_content() for f in ("from", "to", "condition", "hop")}
    assert shown == {"from": A, "to": B, "condition": "rate-limited", "hop": "1"}
    assert row.query_selector("[data-field=dispatch]").text_content() == "d-1"
    page.screenshot(path=str(ARTIFACTS / "dashboard-hops.png"), full_page=True)
