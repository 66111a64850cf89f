"""The account registry (SPEC §4): three legacy identities, then `GATEWAY_ACCOUNTS_FILE`.

The registry is static for the life of the process and holds no credential value: each account
names the environment variable that holds its credential. `candidates_for_model` is the pure,
ordered answer to "which accounts could serve this model".
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from urllib.parse import urlsplit

import msgspec

from shared.codes import WIRE_OF_BINDING, AuthStyle, Binding
from shared.models import serves_model
from shared.settings import Settings
from shared.wire import AccountRoute

ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{1,62}$")
CREDENTIAL_ENV_RE = re.compile(r"^GATEWAY_[A-Z0-9_]+$")
LEGACY_IDS = ("legacy-anthropic", "legacy-zai-harness", "legacy-openai")


class AccountSpec(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    display_name: str
    provider_binding: Binding
    base_url: str
    auth_style: AuthStyle
    credential_env: str
    models: tuple[str, ...]
    lease_capacity: int | None = None
    request_capacity: int | None = None

    @property
    def wire(self) -> str:
        return str(WIRE_OF_BINDING[self.provider_binding])

    def serves(self, model: str) -> bool:
        return serves_model(model, self.models)

    def route(self) -> AccountRoute:
        return AccountRoute(
            id=self.id,
            provider_binding=str(self.provider_binding),
            wire=self.wire,
            base_url=self.base_url,
            auth_style=str(self.auth_style),
            credential_env=self.credential_env,
            request_capacity=self.request_capacity,
            models=self.models,
            lease_capacity=self.lease_capacity,
        )


class _FileAccount(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    id: str
    provider_binding: Binding
    base_url: str
    auth_style: AuthStyle
    credential_env: str
    models: list[str]
    display_name: str | None = None
    lease_capacity: int | None = None
    request_capacity: int | None = None


class _AccountsFile(msgspec.Struct, forbid_unknown_fields=True):
    account: list[dict] = []


class RegistryError(Exception):
    pass


def legacy_accounts(settings: Settings) -> list[AccountSpec]:
    return [
        AccountSpec(
            id="legacy-anthropic",
            display_name="Anthropic (legacy)",
            provider_binding=Binding.ANTHROPIC,
            base_url=settings.anthropic_base_url,
            auth_style=AuthStyle.X_API_KEY,
            credential_env="GATEWAY_ANTHROPIC_API_KEY",
            models=("claude-*",),
        ),
        AccountSpec(
            id="legacy-zai-harness",
            display_name="Z.ai harness (legacy)",
            provider_binding=Binding.ZAI_HARNESS,
            base_url=settings.zai_base_url,
            auth_style=AuthStyle.BEARER,
            credential_env="GATEWAY_ZAI_API_KEY",
            models=("glm-*",),
        ),
        AccountSpec(
            id="legacy-openai",
            display_name="OpenAI (legacy)",
            provider_binding=Binding.OPENAI,
            base_url=settings.openai_base_url,
            auth_style=AuthStyle.BEARER,
            credential_env="GATEWAY_OPENAI_API_KEY",
            models=("gpt-*", "o[0-9]*", "codex-*", "text-embedding-*"),
        ),
    ]


def load_accounts_file(path: str) -> list[AccountSpec]:
    """Decode the TOML file strictly; every refusal names file, entry and field."""
    try:
        with open(path, "rb") as handle:
            raw = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RegistryError(f"{path}: cannot read accounts file: {exc}") from exc
    extra = sorted(set(raw) - {"account"})
    if extra:
        raise RegistryError(f"{path}: unknown top-level key(s) {', '.join(extra)}")
    specs: list[AccountSpec] = []
    seen: set[str] = set()
    for index, entry in enumerate(raw.get("account", [])):
        named = isinstance(entry, dict) and entry.get("id")
        where = f"{path}: account[{index}]" + (f" ({entry.get('id')})" if named else "")
        try:
            item = msgspec.convert(entry, _FileAccount)
        except msgspec.ValidationError as exc:
            raise RegistryError(f"{where}: {exc}") from exc
        _check_entry(item, where, seen)
        seen.add(item.id)
        specs.append(
            AccountSpec(
                id=item.id,
                display_name=item.display_name or item.id,
                provider_binding=item.provider_binding,
                base_url=item.base_url.rstrip("/"),
                auth_style=item.auth_style,
                credential_env=item.credential_env,
                models=tuple(item.models),
                lease_capacity=item.lease_capacity,
                request_capacity=item.request_capacity,
            )
        )
    return specs


def _check_entry(item: _FileAccount, where: str, seen: set[str]) -> None:
    if not ID_RE.match(item.id):
        raise RegistryError(f"{where}: field `id` {item.id!r} must match {ID_RE.pattern}")
    if item.id in LEGACY_IDS:
        raise RegistryError(f"{where}: field `id` {item.id!r} is reserved for a legacy account")
    if item.id in seen:
        raise RegistryError(f"{where}: field `id` {item.id!r} is a duplicate")
    if not CREDENTIAL_ENV_RE.match(item.credential_env):
        raise RegistryError(f"{where}: field `credential_env` must match {CREDENTIAL_ENV_RE.pattern}")
    parts = urlsplit(item.base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RegistryError(f"{where}: field `base_url` must be an http(s) URL")
    if not item.models or any(not m for m in item.models):
        raise RegistryError(f"{where}: field `models` must list at least one pattern")
    for name in ("lease_capacity", "request_capacity"):
        value = getattr(item, name)
        if value is not None and value < 1:
            raise RegistryError(f"{where}: field `{name}` must be at least 1")


class Registry:
    """The ordered, immutable account list of this process."""

    def __init__(self, accounts: list[AccountSpec]) -> None:
        self.accounts: tuple[AccountSpec, ...] = tuple(accounts)
        self._by_id = {a.id: a for a in accounts}

    @classmethod
    def from_settings(cls, settings: Settings) -> Registry:
        accounts = legacy_accounts(settings)
        if settings.accounts_file:
            accounts += load_accounts_file(settings.accounts_file)
        return cls(accounts)

    def get(self, account_id: str) -> AccountSpec | None:
        return self._by_id.get(account_id)

    def legacy_for(self, binding: Binding) -> AccountSpec:
        return next(a for a in self.accounts[:3] if a.provider_binding == binding)

    def candidates_for_model(self, model: str) -> tuple[AccountSpec, ...]:
        return candidates_for_model(self.accounts, model)

    def routes(self) -> list[AccountRoute]:
        return [a.route() for a in self.accounts]


def candidates_for_model(accounts: tuple[AccountSpec, ...], model: str) -> tuple[AccountSpec, ...]:
    """Every account whose model globs match `model`, in registry order."""
    return tuple(a for a in accounts if a.serves(model))


def is_configured(account: AccountSpec, env: Mapping[str, str]) -> bool:
    return bool(env.get(account.credential_env, "").strip())
