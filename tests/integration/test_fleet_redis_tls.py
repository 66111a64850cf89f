"""The fleet's Redis behind its own access control (SPEC §19): an ACL user with a password, over
TLS (`rediss://`), a real redis-server started with `--tls-port` and certificates made here with
`openssl` (a CA, a server certificate for 127.0.0.1, a client certificate: the server asks for
it). The URL's only query options are the three TLS files; the password reaches no log line,
no view and no process listing."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.capacity import StateUnavailable
from shared.chainstorage import ChainBytes
from shared.fleet.chains import RedisChainStorage
from shared.fleet.keys import FleetKeys
from shared.fleet.redis_client import connect, connect_sync, describe
from shared.fleet.scriptline import ScriptLine
from shared.settings import load_settings
from tests.support.fleet import fleet_secret_file
from tests.support.harness import Gateway, Stub, credential_like
from tests.support.redis_server import RedisServer, free_port
from tests.support.waits import wait_until

PASSWORD = credential_like("redis-pw-")


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def make_certificates(where: Path) -> dict[str, Path]:
    """A CA, and a server and a client certificate it signed (P-256 keys: quick to make)."""
    assert shutil.which("openssl"), "openssl is needed to make the test certificates"
    where.mkdir(parents=True, exist_ok=True)
    (where / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    (where / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl(
        "req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=test-ca", cwd=where
    )
    for name in ("server", "client"):
        openssl("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=where)
        openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "1",
            "-extfile",
            f"{name}.ext",
            cwd=where,
        )
    return {n: where / n for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


class TlsRedis:
    def __init__(self, server: RedisServer, tls_port: int, certs: dict[str, Path]) -> None:
        self.server = server
        self.tls_port = tls_port
        self.certs = certs

    def url(self, user: str = "leasehold", password: str = PASSWORD, *, ca: bool = True, client: bool = True) -> str:
        query = [f"ssl_ca_certs={self.certs['ca.pem']}"] if ca else []
        if client:
            query += [f"ssl_certfile={self.certs['client.pem']}", f"ssl_keyfile={self.certs['client.key']}"]
        return f"rediss://{user}:{password}@127.0.0.1:{self.tls_port}/0" + ("?" + "&".join(query) if query else "")


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    where = tmp_path_factory.mktemp("redis-tls")
    certs = make_certificates(where / "certs")
    tls_port = free_port()
    server = RedisServer(
        where / "redis",
        extra_args=[
            "--tls-port",
            str(tls_port),
            "--tls-cert-file",
            str(certs["server.pem"]),
            "--tls-key-file",
            str(certs["server.key"]),
            "--tls-ca-cert-file",
            str(certs["ca.pem"]),
            "--tls-auth-clients",
            "yes",
            "--user",
            "leasehold",
            "on",
            f">{PASSWORD}",
            "~*",
            "&*",
            "+@all",
        ],
    ).start()
    yield TlsRedis(server, tls_port, certs)
    server.stop()


def test_rediss_with_an_acl_user_and_the_three_tls_files(tls_redis: TlsRedis, tmp_path: Path) -> None:
    url = tls_redis.url()
    env = {"GATEWAY_FLEET_REDIS_URL": url, "GATEWAY_FLEET_SECRET_FILE": str(fleet_secret_file(tmp_path))}
    settings = load_settings(env, role="dataplane")  # accepted as it is
    client = connect_sync(settings.fleet_redis_url or "")
    try:
        assert client.acl_whoami() in ("leasehold", b"leasehold")  # over TLS, as the ACL user
        chain = RedisChainStorage(client, FleetKeys("tls"), "policy")
        assert chain.read() == ChainBytes(None, b"", None)
    finally:
        client.close()
    assert PASSWORD not in describe(url) and describe(url) == f"rediss://127.0.0.1:{tls_redis.tls_port}/0"


@pytest.mark.parametrize("case", ["wrong password", "unknown user", "no client certificate", "system CAs only"])
def test_what_the_server_refuses_is_unavailable_never_a_silent_downgrade(tls_redis: TlsRedis, case: str) -> None:
    url = {
        "wrong password": tls_redis.url(password="not-it"),
        "unknown user": tls_redis.url(user="mallory"),
        "no client certificate": tls_redis.url(client=False),
        "system CAs only": tls_redis.url(ca=False),
    }[case]
    client = connect_sync(url)
    try:
        with pytest.raises(StateUnavailable) as caught:
            chain = RedisChainStorage(client, FleetKeys("tls"), "policy")
            chain.read()
        assert PASSWORD not in str(caught.value)
    finally:
        client.close()


async def test_the_data_planes_script_line_connects_as_the_pool_does(tls_redis: TlsRedis) -> None:
    """Issue 27: the hot scripts' own connection, over TLS with the three files, as the ACL user;
    a wrong password is unavailable and never quoted."""
    for url, works in (
        (tls_redis.url(), True),
        (tls_redis.url(password="not-it"), False),
        (tls_redis.url(client=False), False),
    ):
        client = connect(url)
        line = ScriptLine.of(client)
        try:
            echo = client.register_script("return tonumber(ARGV[1])")
            if works:
                assert await line.run(echo, [], [27]) == 27
            else:
                with pytest.raises(StateUnavailable) as caught:
                    await line.run(echo, [], [27])
                assert PASSWORD not in str(caught.value) and "not-it" not in str(caught.value)
        finally:
            line.close()
            await client.aclose()


def test_a_pair_over_tls_with_an_acl_user_joins_and_mints(tls_redis: TlsRedis, tmp_path: Path, stub: Stub) -> None:
    from tests.support.fleetpairs import accounts_toml, mint

    accounts = tmp_path / "accounts.toml"
    accounts.write_text(accounts_toml(stub, lease_capacity=2))
    gw = Gateway(
        tmp_path / "gw",
        stub,
        {
            "GATEWAY_FLEET_REDIS_URL": tls_redis.url(),
            "GATEWAY_FLEET_ID": "tls-pair",
            "GATEWAY_HOST_ID": "gw-tls",
            "GATEWAY_FLEET_SECRET_FILE": str(fleet_secret_file(tmp_path)),
            "GATEWAY_ACCOUNTS_FILE": str(accounts),
            "GATEWAY_TEAM_A_KEY": stub.anthropic_key or "",
            "GATEWAY_TEAM_B_KEY": stub.anthropic_key or "",
        },
    )
    try:
        gw.start()
        wait_until(lambda: gw.api("GET", "/control/v2/fleet")[2]["state"] == "available", 20, "the pair joined")
        answers: list[tuple[int, dict]] = []

        def minted() -> bool:
            # Each TLS connection's handshake is bounded at 1 s: on a loaded machine one may miss it,
            # and the mint is then held (503 fleet-state-unavailable, retry-after) — never refused.
            status, _, body = mint(gw, f"d-tls-{len(answers)}")
            answers.append((status, body))
            assert status == 201 or body.get("refusal_reason") == "fleet-state-unavailable", body
            return status == 201

        wait_until(minted, 30, "a mint over TLS", interval_s=0.5)
        assert answers[-1][1]["account_id"] == "team-a", answers[-1]
        for proc in (gw.control, gw.dataplane):
            assert proc is not None
            cmdline = Path(f"/proc/{proc.popen.pid}/cmdline").read_bytes()
            assert PASSWORD.encode() not in cmdline
        assert PASSWORD not in gw.logs()
        for path in ("/control/v2/fleet", "/control/v2/accounts"):
            assert PASSWORD not in str(gw.api("GET", path)[2])
    finally:
        gw.stop()
