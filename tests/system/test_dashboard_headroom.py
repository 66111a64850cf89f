"""The dashboard's provider headroom (SPEC §22), in headless Chromium: a bar per kind the
provider reported, its share left and its reset, on the account's row and nowhere in its health."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.support.harness import credential_like, http
from tests.system.test_dashboard import ARTIFACTS, WAIT_MS, browser, open_dashboard, page  # noqa: F401 (fixtures)
from tests.system.test_headroom import MODEL, anthropic_headers

pytestmark = pytest.mark.timeout(600)  # the first Chromium test may install it (test_dashboard.py)


def test_each_kind_is_a_bar_with_its_share_and_reset(page: Any, make_gateway, clean_stub) -> None:
    read_token = credential_like("read_")
    gw = make_gateway({"GATEWAY_READ_TOKEN": read_token}).start()
    open_dashboard(page, gw, read_token)
    row = "#accounts tr[data-account-id='legacy-anthropic']"
    assert page.text_content(f"{row} [data-field=headroom]") == "not reported"

    lease = gw.mint()
    step = json.dumps({"headers": anthropic_headers(1500, time.time() + 300)})
    status, _, _ = http(
        "POST",
        gw.dataplane_url + "/v1/messages",
        {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        {"x-api-key": lease["token"], "x-stub-step": step},
    )
    assert status == 200
    tokens = page.wait_for_selector(f"{row} [data-field=headroom] [data-kind=tokens]", timeout=WAIT_MS)
    assert tokens.text_content().startswith("tokens3.8 % · 1,500 / 40,000 · resets ")
    assert tokens.query_selector("svg.headroom-bar rect.fill-bad") is not None
    kinds = page.eval_on_selector_all(
        f"{row} [data-field=headroom] [data-kind]", "nodes => nodes.map(n => n.dataset.kind)"
    )
    assert kinds == ["requests", "tokens", "input_tokens", "output_tokens"]
    fill = page.get_attribute(f"{row} [data-kind=requests] rect.fill-ok", "width")
    assert float(fill) == 0.98 * 120
    assert page.text_content(f"{row} [data-field=health] .badge") == "healthy"  # headroom is not health
    assert page.text_content("#accounts tr[data-account-id='legacy-openai'] [data-field=headroom]") == "not reported"
    page.screenshot(path=str(ARTIFACTS / "dashboard-headroom.png"), full_page=True)
