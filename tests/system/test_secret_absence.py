"""Zero credential disclosure, machine-checked (seed 002 D4).

A gateway built with credential-shaped values serves a lease, an in-flight stream and finished
routes; then every read payload, every state-dir file, both daemons' logs and the OTLP trace
payloads as a collector receives them (SPEC §21) are searched for the provider key, the control
token, the minted tokens (v1 and v2) and their secret halves (the OTLP payloads also for both
tokens' digests, the collector's own key, the prompt's text and the completion's). A schema guard and
an AST sweep hold future read models and projection modules to the same rule; the presence of
`key_id` keeps the sweep from being vacuous.
"""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
import secrets
import threading

import msgspec
import pytest

import controlplane.http
from shared.tokens import digest
from tests.support.harness import REPO, Gateway, Stub, credential_like, http
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.stub_upstream import anthropic_message
from tests.support.waits import wait_until

FORBIDDEN_FIELD = re.compile(r"token|secret|api_key|digest|fingerprint")
# Billing counts are not credentials: a usage field is named `<kind>_tokens`.
BILLING_FIELD = re.compile(r"^(input|output|cache_read|cache_creation)_tokens$")
PROJECTION_MODULES = [
    "controlplane/http/accounts.py",
    "controlplane/http/views.py",
    "controlplane/http/events.py",
    "controlplane/http/metrics.py",
    "controlplane/http/dashboard.py",
    "controlplane/http/admin.py",
    "controlplane/http/policy.py",
    "controlplane/http/fleet.py",
    "controlplane/http/traces.py",
]
READ_ROUTES = [
    "/healthz",
    "/control/v2/accounts",
    "/control/v2/routes/active",
    "/control/v2/routes/recent?limit=200",
    "/control/v2/accounts/admin",
    "/control/v2/accounts/audit",
    "/control/v2/policy",
    "/control/v2/policy/audit",
    "/control/v2/policy/explain?repo_slug=acme/app&model=claude-sonnet-4-6",
    "/metrics",
    "/control/v2/fleet",
    "/control/v2/traces/{attempt_id}",  # the span of the first attempt, as `leaseholdctl trace` reads it
]


@pytest.fixture(scope="module")
def exposed(tmp_path_factory: pytest.TempPathFactory):
    """Drive the gateway, then collect everything an observer could read."""
    workdir = tmp_path_factory.mktemp("secrets")
    provider_key = "sk-ant-api03-" + secrets.token_urlsafe(72)
    control_token = secrets.token_hex(32)  # a 32-byte control token
    stub = Stub(workdir / "stub", anthropic_key=provider_key, openai_key=None)
    collector = OtlpReceiver().start()
    collector_key = credential_like("hc_")
    prompt = "prompt-" + secrets.token_hex(16)
    completion = "completion-" + secrets.token_hex(16)
    answer = json.loads(anthropic_message("claude-sonnet-4-6", 3))
    answer["content"][0]["text"] = completion  # the provider's answer, with a text to look for
    gw = Gateway(
        workdir / "gw",
        stub,
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "50",
            "OTEL_EXPORTER_OTLP_HEADERS": f"x-collector-key={collector_key}",
        },
    )
    gw.control_token = control_token
    gw.env["GATEWAY_CONTROL_TOKEN"] = control_token
    gw.start()
    try:
        minted = gw.mint()
        token = minted["token"]
        body = {"model": "claude-sonnet-4-6", "max_tokens": 5, "messages": [{"role": "user", "content": prompt}]}
        answered = {"x-api-key": token, "x-stub-step": json.dumps({"body": json.dumps(answer)})}
        status, _, got = http("POST", gw.dataplane_url + "/v1/messages", body, answered)
        assert status == 200 and got["content"][0]["text"] == completion  # non-vacuity: it was relayed
        assert (
            http(
                "POST",
                gw.dataplane_url + "/v1/messages",
                body,
                {"Authorization": f"Bearer {token}", "x-stub-step": '{"status": 401}'},
            )[0]
            == 401
        )
        assert http("POST", gw.dataplane_url + "/v1/messages", body, {"x-api-key": token + "x"})[0] == 401
        live = threading.Thread(
            daemon=True,
            target=lambda: http(
                "POST",
                gw.dataplane_url + "/v1/messages",
                {**body, "stream": True},
                {"x-api-key": token, "x-stub-step": '{"stall_after_events": 2, "stall_s": 2}'},
            ),
        )
        live.start()
        wait_until(lambda: gw.active()["count"] == 1, 10, "an in-flight stream")
        first = gw.ledger()[0]["attempt_id"]
        wait_until(lambda: collector.span_of(first), 15, "the first attempt's span")
        payloads = {
            route: http(
                "GET",
                gw.control_url + route.format(attempt_id=first),
                headers={"Authorization": f"Bearer {control_token}"},
            )
            for route in READ_ROUTES
        }
        assert payloads["/control/v2/traces/{attempt_id}"][0] == 200
        live.join(15)
        payloads["recent-after"] = http(
            "GET", gw.control_url + "/control/v2/routes/recent", headers={"Authorization": f"Bearer {control_token}"}
        )
        v2 = gw.api(
            "POST",
            "/control/v2/mint",
            {
                "dispatch_id": "d",
                "repo_slug": "acme/app",
                "principal_kind": "worker",
                "principal_id": "w",
                "model": "claude-sonnet-4-6",
            },
        )[2]
        assert http("POST", gw.dataplane_url + "/v1/messages", body, {"x-api-key": v2["token"]})[0] == 200
        assert gw.revoke(v2["key_id"])
        rows = gw.ledger()
        wait_until(lambda: all(collector.span_of(r["attempt_id"]) for r in rows), 15, "every row's span")
    finally:
        gw.stop()
        stub.stop()
        collector.close()
    files = {str(p): p.read_bytes().decode("utf-8", "replace") for p in gw.state_dir.rglob("*") if p.is_file()}
    return {
        "secrets": {
            "provider key": provider_key,
            "control token": control_token,
            "minted token": token,
            "secret half": token.split(".", 1)[1],
            "v2 token": v2["token"],
            "v2 secret half": v2["token"].split(".", 1)[1],
        },
        "key_id": minted["key_id"],
        "payloads": {route: f"{status} {headers} {body}" for route, (status, headers, body) in payloads.items()},
        "files": files,
        "logs": gw.logs(),
        "otlp": {
            "bodies": b"".join(collector.bodies).decode("latin-1"),
            "spans": repr(collector.spans),
            "spans_count": len(collector.spans),
        },
        "otlp_only": {
            "token digest": digest(token).hex(),
            "v2 token digest": digest(v2["token"]).hex(),
            "collector key": collector_key,
            "prompt": prompt,
            "completion": completion,
        },
    }


def test_no_read_payload_carries_a_secret(exposed) -> None:
    for route, text in exposed["payloads"].items():
        for name, value in exposed["secrets"].items():
            assert value not in text, f"{name} in {route}"


def test_no_state_file_carries_a_secret(exposed) -> None:
    assert any(path.endswith("ledger.jsonl") for path in exposed["files"])
    for path, text in exposed["files"].items():
        for name, value in exposed["secrets"].items():
            assert value not in text, f"{name} in {path}"


def test_no_log_line_carries_a_secret(exposed) -> None:
    assert "request_done" in exposed["logs"]
    for name, value in exposed["secrets"].items():
        assert value not in exposed["logs"], f"{name} in the daemons' logs"


def test_no_otlp_payload_carries_a_secret_or_a_prompt(exposed) -> None:
    """SPEC §21: the spans as the collector received them (raw protobuf and decoded)."""
    otlp = exposed["otlp"]
    assert otlp["spans_count"] >= 4 and exposed["key_id"] in otlp["spans"]  # non-vacuity
    forbidden = {**exposed["secrets"], **exposed["otlp_only"]}
    for name, value in forbidden.items():
        assert value not in otlp["bodies"] and value not in otlp["spans"], f"{name} in the OTLP payloads"
    for name, value in exposed["otlp_only"].items():
        if "digest" not in name:  # the key journal holds digests by design (SPEC §13)
            assert value not in exposed["logs"], f"{name} in the daemons' logs"


def test_the_sanitized_join_key_is_published(exposed) -> None:
    """Non-vacuity: the views did render the routes the secrets rode on."""
    assert exposed["key_id"] in exposed["payloads"]["/control/v2/routes/recent?limit=200"]
    assert exposed["key_id"] in exposed["payloads"]["/control/v2/routes/active"]
    assert exposed["key_id"] in exposed["files"][next(p for p in exposed["files"] if p.endswith("ledger.jsonl"))]


def read_models() -> list[type[msgspec.Struct]]:
    models = []
    for info in pkgutil.iter_modules(controlplane.http.__path__):
        module = importlib.import_module(f"controlplane.http.{info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, msgspec.Struct) and value.__module__ == module.__name__:
                models.append(value)
    for name in ("controlplane.events", "controlplane.routebook", "controlplane.circuits"):  # read models' rooms
        module = importlib.import_module(name)
        models += [
            v
            for v in vars(module).values()
            if isinstance(v, type) and issubclass(v, msgspec.Struct) and v.__module__ == module.__name__
        ]
    return models


def test_no_read_model_declares_a_secret_shaped_field() -> None:
    models = read_models()
    names = {m.__name__ for m in models}
    assert {"AccountView", "RouteView", "AccountsView"} <= names  # non-vacuity
    for model in models:
        if model.__name__ in ("MintV1", "MintV2", "Renew"):
            continue  # request bodies, not read models
        for field in model.__struct_fields__:
            assert not (FORBIDDEN_FIELD.search(field) and not BILLING_FIELD.match(field)), f"{model.__name__}.{field}"


CREDENTIAL_READS = ("environ", "getenv", "credentials", "credential_value", "api_key", "token")


def test_projection_modules_never_read_a_credential_value() -> None:
    checked = 0
    for relative in PROJECTION_MODULES:
        path = REPO / relative
        if not path.exists():
            continue
        checked += 1
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                assert node.attr not in CREDENTIAL_READS, f"{relative}:{node.lineno} reads .{node.attr}"
            if isinstance(node, ast.Name):
                assert node.id not in ("environ", "getenv"), f"{relative}:{node.lineno} reads {node.id}"
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
                assert node.value.attr != "env", f"{relative}:{node.lineno} indexes an env mapping"
    assert checked >= 2
