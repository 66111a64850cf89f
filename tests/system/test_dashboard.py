"""`GET /dashboard` in a real headless Chromium against real daemons (SPEC §11, seed 002).

Chromium is Debian's package, which `make test` installs before pytest starts (`make chromium`);
when it is missing the tests skip saying so, and fail under CI (`tests/support/prerequisites.py`).
Playwright drives it through `executable_path` and never downloads a browser of its own.
Screenshots land in `tests/artifacts/`.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.support.harness import Gateway, Stub, credential_like, http
from tests.support.prerequisites import CHROMIUM, CHROMIUM_INSTALL, missing

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
MODEL = "claude-sonnet-4-6"
TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_creation_tokens")
WAIT_MS = 15_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright import sync_api  # in the test extra, so always installed with the suite

    if not os.access(CHROMIUM, os.X_OK):
        missing(CHROMIUM, CHROMIUM_INSTALL)
    with sync_api.sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh tab; the test fails on any uncaught script error or Content-Security-Policy refusal."""
    context = browser.new_context(viewport={"width": 1500, "height": 1000})
    opened = context.new_page()
    faults: list[str] = []
    opened.on("pageerror", lambda error: faults.append(f"uncaught: {error}"))
    opened.on(
        "console", lambda message: faults.append(message.text) if "Content Security Policy" in message.text else None
    )
    yield opened
    context.close()
    assert faults == []


def open_dashboard(page: Any, gw: Gateway, token: str) -> list[str]:
    """Load the page, type the token, wait until the feed is live; returns every URL requested."""
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto(gw.control_url + "/dashboard")
    page.fill("#token-input", token)
    page.click("#token-submit")
    page.wait_for_selector("#feed-state[data-state=live]", timeout=WAIT_MS)
    page.wait_for_selector("#accounts tr[data-account-id='legacy-openai']", timeout=WAIT_MS)
    return requested


def stream_slowly(gw: Gateway, token: str, done: dict[str, Any]) -> None:
    sdk = anthropic.Anthropic(base_url=gw.dataplane_url, api_key=token, max_retries=0)
    with sdk.messages.stream(
        model=MODEL,
        max_tokens=16,
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"x-stub-step": '{"stall_after_events": 2, "stall_s": 2}'},
    ) as s:
        done["text"] = s.get_final_text()


def test_a_streaming_route_shows_live_then_moves_to_recent_with_its_tokens(
    page: Any, make_gateway, clean_stub: Stub
) -> None:
    read_token = credential_like("read_")
    gw = make_gateway({"GATEWAY_READ_TOKEN": read_token}).start()
    requested = open_dashboard(page, gw, read_token)

    # Each account fact on its own; no evidence is `unverified` in a neutral tone, never green.
    openai_row = "#accounts tr[data-account-id='legacy-openai']"
    health = page.locator(f"{openai_row} [data-field=health] .badge")
    assert health.text_content() == "unverified" and "tone-neutral" in health.get_attribute("class")
    assert "no-evidence" in page.text_content(f"{openai_row} [data-field=health]")
    assert page.text_content(f"{openai_row} [data-field=circuit]").startswith("closed")
    assert "900 s" in page.text_content("#evidence-window")
    admin = page.text_content("#admin-status")
    assert "admin overlay not available on this gateway" in admin or "revision" in admin, admin
    # SPEC §16: the fleet section; embedded mode is a fleet of one, and says so
    page.wait_for_selector("#fleet-hosts tr[data-host-id]", timeout=WAIT_MS)
    assert "embedded · available" in page.text_content("#fleet-status")
    assert page.locator("#fleet-hosts tr[data-host-id]").count() == 1
    assert page.text_content("#fleet-hosts [data-field=lease_count]") == "0"

    minted = gw.mint()
    done: dict[str, Any] = {}
    worker = threading.Thread(target=stream_slowly, args=(gw, minted["token"], done))
    worker.start()
    try:
        live = page.wait_for_selector("#live-routes tr[data-attempt-id]", timeout=WAIT_MS)
        attempt_id = live.get_attribute("data-attempt-id")
        page.wait_for_selector(
            "#accounts tr[data-account-id='legacy-anthropic'] [data-field=in_flight]:text-is('1 streaming')",
            timeout=WAIT_MS,
        )
        page.screenshot(path=str(ARTIFACTS / "dashboard-live.png"), full_page=True)
        recent = page.wait_for_selector(f"#recent-routes tr[data-attempt-id='{attempt_id}']", timeout=WAIT_MS)
    finally:
        worker.join(30)
    assert done.get("text"), "the streaming request did not complete"
    assert page.locator(f"#live-routes tr[data-attempt-id='{attempt_id}']").count() == 0
    row = next(r for r in gw.wait_rows(1) if r["attempt_id"] == attempt_id)
    shown = {field: recent.query_selector(f"[data-field={field}]").text_content() for field in TOKEN_FIELDS}
    assert shown == {field: str(row["usage"][field]) for field in TOKEN_FIELDS}
    assert recent.get_attribute("data-status") == "completed"
    assert recent.query_selector("[data-field=cost_usd]").text_content() == f"{row['cost_usd']:.6f}"
    anthropic_row = "#accounts tr[data-account-id='legacy-anthropic']"
    page.wait_for_selector(f"{anthropic_row} [data-field=in_flight]:text-is('none')", timeout=WAIT_MS)
    assert page.text_content(f"{anthropic_row} [data-field=observed]").startswith("1 (0 aborted)")
    assert page.text_content(f"{anthropic_row} [data-field=leased]") == "1 lease"
    page.screenshot(path=str(ARTIFACTS / "dashboard-recent.png"), full_page=True)

    assert requested and all(url.startswith(gw.control_url + "/") for url in requested), requested
    assert page.evaluate("sessionStorage.getItem('leasehold.readToken')") == read_token
    assert page.evaluate("localStorage.length") == 0
    assert read_token not in page.url


def test_a_refused_token_and_an_unreachable_control_daemon_are_said_not_shown_empty_then_recovered(
    page: Any, make_gateway
) -> None:
    read_token = credential_like("read_")
    gw = make_gateway({"GATEWAY_READ_TOKEN": read_token}).start()
    page.goto(gw.control_url + "/dashboard")
    page.fill("#token-input", "not-the-token")
    page.click("#token-submit")
    page.wait_for_selector("#banner:has-text('refused this token (401)')", timeout=WAIT_MS)
    assert page.is_visible("#token-form")

    open_dashboard(page, gw, read_token)
    assert page.is_hidden("#banner")
    gw.control.stop()
    assert http("GET", gw.dataplane_url + "/healthz")[0] in (200, 503)  # the data plane is still up

    banner = page.wait_for_selector("#banner:has-text('Cannot reach the control daemon')", timeout=WAIT_MS)
    text = banner.text_content()
    assert f"Cannot reach the control daemon at {gw.control_url} — is leasehold-control running?" in text
    # Never an empty table that reads as "no accounts": the last data stays, marked stale.
    assert page.locator("#accounts tr[data-account-id]").count() == 3
    assert "stale" in page.get_attribute("#main", "class")
    assert page.get_attribute("#feed-state", "data-state") in ("down", "reconnecting")
    page.wait_for_selector("#live-routes td:has-text('unknown: the event feed is not connected')", timeout=WAIT_MS)
    page.screenshot(path=str(ARTIFACTS / "dashboard-unreachable.png"), full_page=True)

    gw.start_control()  # the page said it reconnects by itself: it does
    page.wait_for_selector("#feed-state[data-state=live]", timeout=WAIT_MS)
    page.wait_for_selector("#banner", state="hidden", timeout=WAIT_MS)
    assert "stale" not in page.get_attribute("#main", "class")


def test_the_page_is_public_self_contained_and_locked_to_its_own_origin(gateway: Gateway) -> None:
    status, headers, page_html = http("GET", gateway.control_url + "/dashboard")
    assert status == 200 and headers["content-type"].startswith("text/html")
    policy = headers["content-security-policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy and "script-src 'self'" in policy
    assert "/dashboard/dashboard.js" in page_html and "/dashboard/dashboard.css" in page_html
    for name, kind in (
        ("dashboard.js", "text/javascript"),
        ("source.js", "text/javascript"),
        ("render.js", "text/javascript"),
        ("charts.js", "text/javascript"),
        ("dashboard.css", "text/css"),
    ):
        status, headers, body = http("GET", f"{gateway.control_url}/dashboard/{name}")
        assert status == 200 and headers["content-type"].startswith(kind) and body
    assert http("GET", gateway.control_url + "/dashboard/../main.py")[0] == 404
    assert http("GET", gateway.control_url + "/dashboard/dashboard.html")[0] == 404  # one name per page
    static = Path(__file__).resolve().parents[2] / "controlplane" / "static"
    for source in static.iterdir():
        text = source.read_text()
        assert "://" not in text, f"{source.name} references another origin"
        assert "innerHTML" not in text and "eval(" not in text, source.name


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", data[16:24])


def put_budget(gw: Gateway, name: str, document: dict) -> None:
    revision = gw.api("GET", "/control/v2/policy")[2]["revision"]
    status, _, body = gw.api(
        "PUT",
        "/control/v2/policy/level",
        {"name": name, "expected_revision": revision, "document": document, "reason": "dashboard"},
    )
    assert status == 200, body


def test_budgets_are_bars_and_each_account_has_its_hours_drawn(page: Any, make_gateway, clean_stub: Stub) -> None:
    read_token = credential_like("read_")
    gw = make_gateway({"GATEWAY_READ_TOKEN": read_token}).start()
    put_budget(gw, "repo:acme/app", {"budgets": [{"window": "day", "usd": 0.00025}]})  # 3 requests exhaust it
    put_budget(gw, "platform", {"budgets": [{"window": "month", "usd": 1}]})
    lease = gw.mint()
    sdk = anthropic.Anthropic(base_url=gw.dataplane_url, api_key=lease["token"], max_retries=0)
    for _ in range(3):
        sdk.messages.create(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    other = gw.mint("openai", repo_slug="solo/x")
    openai.OpenAI(base_url=other["base_url"], api_key=other["token"], max_retries=0).chat.completions.create(
        model="gpt-5", messages=[{"role": "user", "content": "hi"}]
    )
    gw.wait_rows(4)
    open_dashboard(page, gw, read_token)

    exhausted = page.wait_for_selector(
        "#budgets .budget[data-level='repo:acme/app'][data-state=exhausted]", timeout=WAIT_MS
    )
    assert float(exhausted.query_selector("rect.bar-fill").get_attribute("width")) > 0
    assert exhausted.query_selector("rect.bar-over") is not None  # the overshoot, drawn past the mark
    assert "overshoot" in exhausted.text_content() and "held 503" in exhausted.text_content()
    platform = page.locator("#budgets .budget[data-level='platform']")
    assert platform.get_attribute("data-state") == "ok" and "of $1.00" in platform.text_content()

    chart = page.wait_for_selector("#spend-charts svg.spend-chart[data-account-id='legacy-anthropic']", timeout=WAIT_MS)
    bars = chart.query_selector_all("rect.bar-cost")
    unheld = chart.query_selector_all("rect.slot-unheld")
    assert len(bars) + len(unheld) == 24 and bars  # one slot an hour, the last 24
    now = bars[-1]
    assert now.get_attribute("data-attempts") == "3" and float(now.get_attribute("height")) > 0
    points = chart.query_selector("polyline.line-requests").get_attribute("points").split()
    assert len(points) == len(bars)  # a request count for every held hour
    assert page.locator("#spend-charts svg.spend-chart[data-account-id='legacy-openai'] rect.bar-cost").count() == len(
        bars
    )
    assert "3 requests" in page.text_content("#spend-charts .spend-card[data-account-id='legacy-anthropic']")

    whole, money = ARTIFACTS / "dashboard-budgets.png", ARTIFACTS / "dashboard-budgets-charts.png"
    page.screenshot(path=str(whole), full_page=True)
    page.locator("#money").screenshot(path=str(money))
    width, height = png_size(money)
    assert width > 600 and height > 150
    assert money.stat().st_size > 8_000 and whole.stat().st_size > money.stat().st_size  # drawn, not blank
