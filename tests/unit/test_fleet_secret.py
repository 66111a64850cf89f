"""The fleet secret (SPEC §19): what startup refuses, naming the variable and never the content;
the exact bytes as key material; one key per use and per fleet; MACs that verify only their own
fields."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shared.fleet.secret import FleetSecret, Keyring, mac, read_secret_file, verify
from shared.settings import SettingsError, load_settings

NAME = "GATEWAY_FLEET_SECRET_FILE"
CONTENT = b"sk-fleet-" + b"Q7x9" * 12  # credential-shaped: no problem may quote it
FLEET = {"GATEWAY_CONTROL_TOKEN": "control-token-value", "GATEWAY_FLEET_REDIS_URL": "redis://127.0.0.1:6379/0"}


def secret_file(tmp_path: Path, content: bytes = CONTENT, mode: int = 0o600) -> Path:
    path = tmp_path / "fleet-secret"
    path.write_bytes(content)
    path.chmod(mode)
    return path


def problems(env: dict[str, str], role: str = "control") -> list[str]:
    with pytest.raises(SettingsError) as caught:
        load_settings(env, role=role)
    return caught.value.problems


def test_fleet_mode_requires_the_secret_file_naming_the_variable() -> None:
    found = problems(FLEET)
    assert any(NAME in p and "required" in p for p in found), found


REFUSED = [
    ("group-readable", CONTENT, 0o640),
    ("world-readable", CONTENT, 0o644),
    ("executable", CONTENT, 0o700),
    ("short", b"x" * 31, 0o600),
    ("empty", b"", 0o400),
]


@pytest.mark.parametrize("case,content,mode", REFUSED, ids=[c[0] for c in REFUSED])
def test_a_bad_secret_file_is_refused_naming_the_variable_never_the_content(
    tmp_path: Path, case: str, content: bytes, mode: int
) -> None:
    path = secret_file(tmp_path, content, mode)
    found = problems({**FLEET, NAME: str(path)})
    assert any(NAME in p for p in found), found
    assert all(CONTENT.decode() not in p and "Q7x9" not in p for p in found)


def test_a_missing_file_and_a_directory_are_refused(tmp_path: Path) -> None:
    assert any(NAME in p for p in problems({**FLEET, NAME: str(tmp_path / "absent")}))
    assert any(NAME in p and "regular file" in p for p in problems({**FLEET, NAME: str(tmp_path)}))


@pytest.mark.parametrize("mode", [0o400, 0o600])
def test_the_key_material_is_the_files_exact_bytes(tmp_path: Path, mode: int) -> None:
    content = b"  \x00binary secret with a trailing newline, 32+ bytes\n"
    settings = load_settings({**FLEET, NAME: str(secret_file(tmp_path, content, mode))})
    assert settings.fleet_secret == FleetSecret(content)
    assert settings.fleet_secret != FleetSecret(content.strip())


def test_the_secret_never_shows_in_a_repr(tmp_path: Path) -> None:
    settings = load_settings({**FLEET, NAME: str(secret_file(tmp_path))})
    for shown in (
        repr(settings),
        str(settings),
        repr(settings.fleet_secret),
        repr(Keyring(settings.fleet_secret, "f")),
    ):  # type: ignore[arg-type]
        assert "Q7x9" not in shown and "<redacted>" in shown


def test_a_symlinked_file_is_followed(tmp_path: Path) -> None:  # secret managers mount symlinks
    target = secret_file(tmp_path)
    link = tmp_path / "mounted"
    os.symlink(target, link)
    secret, problem = read_secret_file(str(link), NAME)
    assert problem is None and secret == FleetSecret(CONTENT)


def test_the_data_plane_requires_it_too_and_embedded_mode_ignores_it(tmp_path: Path) -> None:
    """Without the secret a fleet data plane would believe unsealed heartbeats, so a Redis writer
    could lift its lapse: it is refused like control, by name, and a bad file is refused alike."""
    dataplane = {k: v for k, v in FLEET.items() if "TOKEN" not in k}
    found = problems(dataplane, role="dataplane")
    assert any(NAME in p and "required" in p for p in found), found
    found = problems({**dataplane, NAME: str(secret_file(tmp_path, mode=0o644))}, role="dataplane")
    assert any(NAME in p for p in found) and all("Q7x9" not in p for p in found), found
    good = secret_file(tmp_path)
    assert load_settings({**dataplane, NAME: str(good)}, role="dataplane").fleet_secret == FleetSecret(CONTENT)
    assert load_settings(dataplane, role="ctl").fleet_secret is None  # leaseholdctl never reads it
    bad = str(secret_file(tmp_path, mode=0o644))
    assert load_settings({"GATEWAY_CONTROL_TOKEN": "t" * 20, NAME: bad}).fleet_secret is None


def test_one_key_per_use_and_per_fleet() -> None:
    secret = FleetSecret(CONTENT)
    keys = {secret.key(f, u) for f in ("a", "b") for u in ("chain/policy", "chain/account-admin", "entry/revoke")}
    assert len(keys) == 6 and all(len(k) == 32 for k in keys)
    assert secret.key("a", "x") == FleetSecret(CONTENT).key("a", "x") != FleetSecret(CONTENT + b"!").key("a", "x")
    ring = Keyring(secret, "a")
    assert ring.key("entry/revoke") == secret.key("a", "entry/revoke")


def test_a_mac_verifies_only_its_own_fields_under_its_own_key() -> None:
    key, other = FleetSecret(CONTENT).key("f", "u"), FleetSecret(CONTENT).key("f", "v")
    tag = mac(key, ["acct-1", 12.5, None])
    assert len(tag) == 43 and verify(key, ["acct-1", 12.5, None], tag)
    assert not verify(other, ["acct-1", 12.5, None], tag)
    for fields in (["acct-1", 12.5], ["acct-1", 12.50001, None], ["acct-", "112.5", None], ["acct-1", "12.5", None]):
        assert not verify(key, fields, tag)
    for presented in (None, b"x", tag[:-1], tag + "A", "A" * 43):
        assert not verify(key, ["acct-1", 12.5, None], presented)


VERIFY = "GATEWAY_FLEET_VERIFY_SECRET_FILE"


def test_a_rotations_other_secret_is_read_by_the_same_rules_and_only_beside_the_secret(tmp_path: Path) -> None:
    """README "Rotating the fleet secret": the other secret's file is refused as the secret's is
    (naming its own variable, never the content), and never without the fleet secret."""
    current = secret_file(tmp_path)
    (tmp_path / "other").mkdir()
    other = secret_file(tmp_path / "other", b"other-" + CONTENT)
    settings = load_settings({**FLEET, NAME: str(current), VERIFY: str(other)})
    assert settings.fleet_verify_secret == FleetSecret(b"other-" + CONTENT)
    assert "other-" not in repr(settings) and "Q7x9" not in repr(settings)
    other.chmod(0o644)
    found = problems({**FLEET, NAME: str(current), VERIFY: str(other)})
    assert any(VERIFY in p and "0644" in p for p in found) and all("Q7x9" not in p for p in found)
    other.chmod(0o600)
    found = problems({**FLEET, VERIFY: str(other)}, role="dataplane")
    assert any(VERIFY in p and NAME in p for p in found), found
    assert load_settings({**FLEET, NAME: str(current)}).fleet_verify_secret is None
