"""Loads the repository's price table (`controlplane/data/prices.toml`) once."""

from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path

import msgspec

from controlplane.core.pricing import PriceTable

PRICES_PATH = Path(__file__).with_name("data") / "prices.toml"


@cache
def load_prices() -> PriceTable:
    with open(PRICES_PATH, "rb") as handle:
        return msgspec.convert(tomllib.load(handle), PriceTable)
