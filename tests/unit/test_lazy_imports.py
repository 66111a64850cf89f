"""An embedded daemon never loads what only fleet mode uses (issue 27: start-up and idle memory).

Importing the Redis client (with the OpenTelemetry API it pulls in) and fleet mode's modules cost
control ~9 MiB of idle RSS and ~130 modules at every start. They are imported only when
`GATEWAY_FLEET_REDIS_URL` is set (`controlplane.wiring.backends_for`, the data plane's admission
set-up). Each check runs in a fresh interpreter, so what an earlier test imported cannot hide a
regression.

Nor does an embedded daemon load what no start needs: `importlib.metadata` (the version for
spans, read when trace export starts) or `importlib.resources` (the dashboard's files are read
as files). Control holds no aiohttp module at all: it serves its HTTP API on `shared.http1`
(httptools), ~13 MiB of idle RSS less (yarl, multidict, `email`, `http.cookies`, aiohttp's
client and web modules). In the data plane, aiohttp's own TLS contexts read the CA bundle at
their first handshake, not at start (`shared/deferred_ca.py`): ~2 MiB of RSS and a third of
`import aiohttp.web`'s CPU. Its one context (its aiohttp sessions use it too) is read on a thread
once it listens (`read_in_background`), or at its first handshake, whichever comes first.

What a daemon holds once it serves is checked too (`SERVING`: the daemon as `python -m` runs
it, its modules written when `settle_heap` ends its start): prometheus-client is imported at the
first scrape of control's `/metrics`, not at start (~1.2 MiB).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.harness import REPO, Gateway, Proc, http
from tests.support.waits import wait_until

# Top-level packages and project modules an embedded daemon must not import.
FLEET_ONLY = (
    "redis",
    "opentelemetry",
    "shared.fleet",
    "controlplane.fleet.wiring",
    "controlplane.fleet.host",
    "controlplane.fleet.view",
    "controlplane.fleet.spend",
    "dataplane.admission",
)


def loaded_after(*modules: str) -> set[str]:
    """The module names a fresh interpreter holds after importing `modules`."""
    code = "import json, sys\n" + "".join(f"import {m}\n" for m in modules) + "print(json.dumps(sorted(sys.modules)))"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OTEL_"))}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=str(REPO), env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return set(json.loads(done.stdout))


def fleet_only(loaded: set[str]) -> list[str]:
    return sorted(m for m in loaded if any(m == f or m.startswith(f + ".") for f in FLEET_ONLY))


# Standard-library packages no start needs (each ~1 MiB with what it brings, zipfile among it).
NOT_AT_START = ("importlib.metadata", "importlib.resources")


@pytest.mark.parametrize("main", ["controlplane.main", "dataplane.main"])
def test_an_embedded_daemons_main_module_imports_nothing_fleet_only(main: str) -> None:
    loaded = loaded_after(main)
    assert fleet_only(loaded) == []
    assert [m for m in NOT_AT_START if m in loaded] == []


# ---- what a serving daemon holds, not only what its main module imports

# A daemon run as `python -m MAIN` runs it, writing the modules it holds once it serves:
# `settle_heap` is each start's last step (its listeners open, before any request).
SERVING = """
import json, os, runpy, sys
import shared.heap
main, out = sys.argv[1], sys.argv[2]
del sys.argv[1:]
settle = shared.heap.settle_heap

def settle_and_write():
    settle()
    with open(out + ".tmp", "w") as fh:
        json.dump(sorted(sys.modules), fh)
    os.replace(out + ".tmp", out)

shared.heap.settle_heap = settle_and_write
runpy.run_module(main, run_name="__main__", alter_sys=True)
"""

# Loaded at its first use, not at start: prometheus-client at the first scrape of `/metrics`.
NOT_WHILE_IDLE = ("prometheus_client", "http.server", "wsgiref")
# Control serves on shared.http1: none of aiohttp, nor what it brings, is ever loaded there.
NOT_IN_CONTROL = ("aiohttp", "aiohttp_sse", "yarl", "multidict", "aiohappyeyeballs", "email", "http.cookies")


def held(loaded: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(m for m in loaded if any(m == p or m.startswith(p + ".") for p in packages))


def serving_modules(gw: Gateway, main: str, proc_attr: str) -> set[str]:
    """Start `main` for `gw` through SERVING; the modules it holds once it serves."""
    out = gw.workdir / f"{main}.modules.json"
    proc = Proc([sys.executable, "-c", SERVING, main, str(out)], gw.env, gw.workdir / f"{proc_attr}.log")
    setattr(gw, proc_attr, proc)
    wait_until(lambda: proc.require_alive(main) and out.exists(), 60, f"{main} serving")
    return set(json.loads(out.read_text()))


def test_serving_daemons_hold_nothing_fleet_only_and_no_metrics_library_until_scraped(tmp_path: Path) -> None:
    gw = Gateway(tmp_path, None)
    try:
        control = serving_modules(gw, "controlplane.main", "control")
        dataplane = serving_modules(gw, "dataplane.main", "dataplane")
        gw.wait_synchronised()
        for loaded in (control, dataplane):
            assert fleet_only(loaded) == []
            assert [m for m in (*NOT_AT_START, *NOT_WHILE_IDLE) if m in loaded] == []
        assert held(control, NOT_IN_CONTROL) == []
        assert "aiohttp.web" in dataplane  # the check can fail: the data plane does load aiohttp
        status, headers, text = http(
            "GET", gw.control_url + "/metrics", headers={"Authorization": f"Bearer {gw.control_token}"}
        )
        assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
        for family in ("leasehold_attempts_total counter", "leasehold_mint_decisions_total counter"):
            assert f"# TYPE {family}\n" in text
        assert "# TYPE leasehold_in_flight gauge\n" in text
    finally:
        gw.stop()


def test_the_serving_check_sees_what_a_start_loads(tmp_path: Path) -> None:
    """The check itself can fail: what the start does load is in the list it writes."""
    gw = Gateway(tmp_path, None)
    try:
        loaded = serving_modules(gw, "controlplane.main", "control")
    finally:
        gw.stop()
    assert {"controlplane.wiring", "controlplane.stores.ledger", "uvloop", "shared.http1.server", "httptools"} <= loaded


def test_the_check_sees_a_fleet_import() -> None:
    """The check itself can fail: fleet mode's wiring does load the Redis client."""
    loaded = fleet_only(loaded_after("controlplane.fleet.wiring"))
    assert "redis" in loaded and "controlplane.fleet.wiring" in loaded


# ---- aiohttp's own TLS contexts read the CA bundle at their first handshake (shared/deferred_ca.py)

# A daemon's main module imported, then a verified GET through aiohttp's default context (and, for
# the data plane, through its own upstream sessions) to a TLS server on 127.0.0.1; what each
# context held before and after, as JSON.
HANDSHAKE = """
import asyncio, json, ssl, sys
import {main}
import aiohttp, aiohttp.connector
from aiohttp import web
CERT, KEY = sys.argv[1], sys.argv[2]
verified = aiohttp.connector._SSL_CONTEXT_VERIFIED
seen = {{"aiohttp_before": verified.cert_store_stats()["x509_ca"]}}

async def get(session, port):
    try:
        async with session.get(f"https://127.0.0.1:{{port}}/") as response:
            return response.status
    except aiohttp.ClientConnectorCertificateError:
        return "certificate-refused"

async def main():
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(CERT, KEY)
    app = web.Application()
    app.router.add_get("/", lambda request: web.Response(text="ok"))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_side)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    if "{main}" == "dataplane.main":
        from dataplane.upstream_client import UPSTREAM_TLS
        from dataplane.upstreams import UpstreamPools
        from shared.settings import load_settings
        seen["upstream_at_start"] = UPSTREAM_TLS.cert_store_stats()["x509_ca"]
        async with UpstreamPools(load_settings({{}}, role="dataplane"))._session() as session:
            seen["upstream_session"] = await get(session, port)
        seen["aiohttp_after_upstream"] = verified.cert_store_stats()["x509_ca"]
    async with aiohttp.ClientSession() as session:
        seen["aiohttp_default"] = await get(session, port)
    seen["aiohttp_after"] = verified.cert_store_stats()["x509_ca"]
    await runner.cleanup()

asyncio.run(main())
print(json.dumps(seen))
"""


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """Two self-signed certificates for 127.0.0.1 (each its own CA): one to serve, one other."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    where = tmp_path_factory.mktemp("ca")
    made = {}
    for name in ("served", "other"):
        cert, key = where / f"{name}.pem", where / f"{name}.key"
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "1",
                "-subj",
                f"/CN={name}",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
                "-keyout",
                str(key),
                "-out",
                str(cert),
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        made[name] = (str(cert), str(key))
    (where / "empty").mkdir()
    made["dir"] = (str(where / "empty"), "")
    return made


def handshake(main: str, served: tuple[str, str], trusted: str, cert_dir: str) -> dict[str, object]:
    """Run HANDSHAKE in a fresh interpreter whose default CA file is `trusted` (OpenSSL reads
    SSL_CERT_FILE when a context reads its default paths)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OTEL_", "SSL_CERT_"))}
    env.update(SSL_CERT_FILE=trusted, SSL_CERT_DIR=cert_dir)
    done = subprocess.run(
        [sys.executable, "-c", HANDSHAKE.format(main=main), *served],
        cwd=str(REPO),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize("main", ["dataplane.main"])  # control holds no aiohttp (the serving check)
def test_aiohttps_contexts_read_the_ca_bundle_at_their_first_handshake_not_at_start(
    main: str, certificates: dict[str, tuple[str, str]]
) -> None:
    served, other, cert_dir = certificates["served"], certificates["other"], certificates["dir"][0]
    trusting = handshake(main, served, served[0], cert_dir)
    assert trusting["aiohttp_before"] == 0  # nothing read at start
    assert trusting["aiohttp_default"] == 200  # read at the first handshake, and verified with
    assert trusting["aiohttp_after"] == 1
    refusing = handshake(main, served, other[0], cert_dir)
    assert refusing["aiohttp_default"] == "certificate-refused"  # verification is on
    if main == "dataplane.main":  # its own context, deferred too; its sessions use it
        assert trusting["upstream_at_start"] == 0 and trusting["upstream_session"] == 200
        assert trusting["aiohttp_after_upstream"] == 0  # aiohttp's own contexts never read
        assert refusing["upstream_session"] == "certificate-refused"


def test_the_check_sees_a_ca_read_at_import(certificates: dict[str, tuple[str, str]]) -> None:
    """Without shared.deferred_ca, importing aiohttp reads the CA file into its verified context."""
    code = "import aiohttp.connector as c; print(c._SSL_CONTEXT_VERIFIED.cert_store_stats()['x509_ca'])"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SSL_CERT_")}
    env.update(SSL_CERT_FILE=certificates["served"][0], SSL_CERT_DIR=certificates["dir"][0])
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=str(REPO), env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["1"]


def test_read_in_background_reads_a_deferred_context_and_leaves_others_alone(
    certificates: dict[str, tuple[str, str]],
) -> None:
    """The data plane's start reads its context on a thread (`dataplane.main.serve`); a context
    built outside the deferral is not touched; a second read is a no-op."""
    code = """
import json, ssl
from shared import deferred_ca
from tests.support.waits import wait_until
deferred, plain = deferred_ca.create_default_context(), ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
seen = [deferred.cert_store_stats()["x509_ca"], deferred.verify_mode == ssl.CERT_REQUIRED, deferred.check_hostname]
deferred_ca.read_in_background(deferred)
deferred_ca.read_in_background(plain)
wait_until(lambda: deferred.cert_store_stats()["x509_ca"] == 1, 30, "the background read")
deferred_ca.read_default_paths(deferred)
seen += [deferred.cert_store_stats()["x509_ca"], plain.cert_store_stats()["x509_ca"], "wrap_bio" in vars(deferred)]
print(json.dumps(seen))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SSL_CERT_")}
    env.update(SSL_CERT_FILE=certificates["served"][0], SSL_CERT_DIR=certificates["dir"][0])
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=str(REPO), env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == [0, True, True, 1, 0, False]


def test_the_data_plane_starts_no_process_pool() -> None:
    """Large bodies are read in reader processes started at the first one (dataplane/readers.py,
    no multiprocessing); no start loads a process pool (tests/hostile/test_large_bodies.py checks
    that a started data plane has no child process)."""
    loaded = loaded_after("dataplane.main")
    assert "dataplane.readers" in loaded  # the check can fail: it sees what is loaded
    assert [m for m in ("multiprocessing", "concurrent.futures.process") if m in loaded] == []
