"""The account registry: legacy identities, the accounts file and every refusal (SPEC §4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controlplane.core.candidates import build_candidates
from controlplane.core.policy import ResolvedPolicy
from controlplane.registry import Registry, RegistryError, load_accounts_file
from shared.settings import load_settings

SETTINGS = load_settings({"GATEWAY_CONTROL_TOKEN": "x" * 16})
GOOD = """
id = "{id}"
provider_binding = "anthropic"
base_url = "https://api.anthropic.com"
auth_style = "x-api-key"
credential_env = "GATEWAY_{env}_KEY"
models = ["claude-*"]
"""


def write(tmp_path: Path, body: str) -> str:
    path = tmp_path / "accounts.toml"
    path.write_text(body)
    return str(path)


def entry(**over: str) -> str:
    text = GOOD.format(id=over.pop("id", "team-b"), env=over.pop("env", "TEAM_B"))
    for key, value in over.items():
        lines = [line for line in text.splitlines() if not line.startswith(key + " ")]
        text = "\n".join(lines) + ("" if value is None else f"\n{key} = {value}")
    return "[[account]]" + text + "\n"


def test_legacy_accounts_always_present_in_order() -> None:
    registry = Registry.from_settings(SETTINGS)
    assert [a.id for a in registry.accounts] == ["legacy-anthropic", "legacy-zai-harness", "legacy-openai"]
    assert [a.id for a in registry.candidates_for_model("claude-sonnet-4-6")] == ["legacy-anthropic"]
    assert [a.id for a in registry.candidates_for_model("glm-4.6")] == ["legacy-zai-harness"]
    for model in ("gpt-5", "o3-mini", "o4", "codex-mini", "text-embedding-3-small"):
        assert [a.id for a in registry.candidates_for_model(model)] == ["legacy-openai"], model
    assert registry.candidates_for_model("llama-3") == ()


def test_declared_accounts_follow_in_file_order(tmp_path: Path) -> None:
    path = write(tmp_path, entry(id="zeta", env="ZETA") + entry(id="alpha", env="ALPHA"))
    settings = load_settings({"GATEWAY_CONTROL_TOKEN": "x" * 16, "GATEWAY_ACCOUNTS_FILE": path})
    registry = Registry.from_settings(settings)
    assert [a.id for a in registry.candidates_for_model("claude-x")] == ["legacy-anthropic", "zeta", "alpha"]


REFUSALS = [
    ("unknown key", entry(colour='"blue"'), "colour"),
    ("reserved id", entry(id="legacy-openai"), "reserved"),
    ("bad id", entry(id="Team_B"), "`id`"),
    ("credential env outside the pattern", entry(env="lower").replace("GATEWAY_lower_KEY", "MY_KEY"), "credential_env"),
    ("non-http base url", entry(base_url='"ftp://example.com"'), "base_url"),
    ("empty models", entry(models="[]"), "models"),
    ("unknown binding", entry(provider_binding='"mistral"'), "provider_binding"),
    ("unknown auth style", entry(auth_style='"basic"'), "auth_style"),
    ("missing field", entry(base_url=None), "base_url"),
    ("zero capacity", entry(lease_capacity="0"), "lease_capacity"),
]


@pytest.mark.parametrize("name,body,field", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refusals_name_file_entry_and_field(tmp_path: Path, name: str, body: str, field: str) -> None:
    path = write(tmp_path, body)
    with pytest.raises(RegistryError) as caught:
        load_accounts_file(path)
    message = str(caught.value)
    assert path in message and "account[0]" in message and field in message


def test_duplicate_id_names_the_second_entry(tmp_path: Path) -> None:
    path = write(tmp_path, entry() + entry())
    with pytest.raises(RegistryError, match=r"account\[1\].*duplicate"):
        load_accounts_file(path)


def test_candidates_narrowed_and_ordered_by_policy(tmp_path: Path) -> None:
    path = write(tmp_path, entry(id="bb", env="B") + entry(id="cc", env="C"))
    registry = Registry.from_settings(load_settings({"GATEWAY_CONTROL_TOKEN": "x" * 16, "GATEWAY_ACCOUNTS_FILE": path}))

    def ids(policy: ResolvedPolicy, **kw: Any) -> list[str]:
        return [c.account_id for c in build_candidates(registry.accounts, policy, **kw)]

    assert ids(ResolvedPolicy(), model="claude-x", model_class=None) == ["legacy-anthropic", "bb", "cc"]
    assert ids(
        ResolvedPolicy(account_order=("cc", "legacy-anthropic", "nope")), model="claude-x", model_class=None
    ) == ["cc", "legacy-anthropic"]
    assert ids(ResolvedPolicy(providers=("openai",)), model="claude-x", model_class=None) == []
    classes = {"smart": {"anthropic": "claude-opus-4-7", "zai-harness": "glm-4.6"}}
    built = build_candidates(registry.accounts, ResolvedPolicy(model_classes=classes), None, "smart")
    assert [(c.account_id, c.effective_model, c.position) for c in built] == [
        ("legacy-anthropic", "claude-opus-4-7", 0),
        ("legacy-zai-harness", "glm-4.6", 1),
        ("bb", "claude-opus-4-7", 2),
        ("cc", "claude-opus-4-7", 3),
    ]
