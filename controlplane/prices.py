"""Loads the price table: the repository's (`controlplane/data/prices.toml`), extended and
overridden by `GATEWAY_PRICES_FILE` when it is set (SPEC §18: the file's entries are matched
first). A malformed file is a `PricesError` naming file, entry and field; control refuses to
start on it (exit 2)."""

from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path

import msgspec

from controlplane.core.pricing import PriceTable, check_price_entries, with_overrides

PRICES_PATH = Path(__file__).with_name("data") / "prices.toml"


class PricesError(Exception):
    """The prices file is unreadable or malformed; `problems` names each entry and field."""

    def __init__(self, problems: tuple[str, ...]) -> None:
        super().__init__("invalid prices file:\n  " + "\n  ".join(problems))
        self.problems = problems


@cache
def shipped_prices() -> PriceTable:
    with open(PRICES_PATH, "rb") as handle:
        return msgspec.convert(tomllib.load(handle), PriceTable)


def load_price_file(path: str) -> PriceTable:
    """The file's entries alone, strictly checked."""
    try:
        with open(path, "rb") as handle:
            raw = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PricesError((f"{path}: cannot read prices file (GATEWAY_PRICES_FILE): {exc}",)) from exc
    prices, problems = check_price_entries(raw, path)
    if problems:
        raise PricesError(problems)
    return PriceTable(price=prices)


def load_prices(prices_file: str | None = None) -> PriceTable:
    """The table control prices rows with: the file's entries (if any) before the shipped ones."""
    shipped = shipped_prices()
    return shipped if prices_file is None else with_overrides(shipped, load_price_file(prices_file).price)
