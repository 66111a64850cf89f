"""The prices file (SPEC §18): `check_price_entries` by table, and the file's entries first."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import pytest

from controlplane.core.pricing import Price, PriceLookup, check_price_entries, pattern_problem, price_for
from controlplane.prices import PricesError, load_price_file, load_prices, shipped_prices

SOURCE = "/etc/leasehold/prices.toml"
GOOD = {"models": ["claude-sonnet-5*"], "input": 3.0, "output": 15, "cache_read": 0.3, "cache_creation": 3.75}


def entry(**fields: Any) -> dict[str, Any]:
    drop = {k for k, v in fields.items() if v is ...}
    return {k: v for k, v in {**GOOD, **fields}.items() if k not in drop}


class Case(NamedTuple):
    name: str
    given: Any
    expect: tuple[str, ...]  # fragments: each problem line must contain its fragment, in order


CASES = [
    Case("one good entry", {"price": [GOOD]}, ()),
    Case("integers are numbers", {"price": [entry(input=3, cache_creation=0)]}, ()),
    Case("not a document", ["price"], ("must be a TOML document",)),
    Case("no entry", {}, ("no [[price]] entry",)),
    Case("empty entry list", {"price": []}, ("no [[price]] entry",)),
    Case("unknown top-level key", {"prices": [GOOD], "price": [GOOD]}, ("unknown top-level key `prices`",)),
    Case("an entry that is not a table", {"price": ["claude-*"]}, ("price[0]: must be a table",)),
    Case(
        "unknown field", {"price": [entry(currency="EUR")]}, ("price[0] (claude-sonnet-5*): unknown field `currency`",)
    ),
    Case(
        "missing number",
        {"price": [entry(cache_read=...)]},
        ("price[0] (claude-sonnet-5*): field `cache_read` is missing",),
    ),
    Case("missing models", {"price": [entry(models=...)]}, ("price[0]: field `models` is missing",)),
    Case(
        "negative number",
        {"price": [GOOD, entry(output=-1.0)]},
        ("price[1] (claude-sonnet-5*): field `output` must not be negative",),
    ),
    Case("a string is not a number", {"price": [entry(input="3.0")]}, ("field `input` must be a number",)),
    Case("a boolean is not a number", {"price": [entry(input=True)]}, ("field `input` must be a number",)),
    Case("infinity is not a price", {"price": [entry(input=float("inf"))]}, ("field `input` must be a number",)),
    Case("empty models", {"price": [entry(models=[])]}, ("field `models` must list at least one glob",)),
    Case(
        "models is not a list", {"price": [entry(models="claude-*")]}, ("field `models` must list at least one glob",)
    ),
    Case(
        "an empty glob", {"price": [entry(models=["claude-*", ""])]}, ("field `models` entry '' must be a non-empty",)
    ),
    Case(
        "a glob with a space",
        {"price": [entry(models=["claude sonnet*"])]},
        ("entry 'claude sonnet*' must be at most",),
    ),
    Case("an unclosed bracket", {"price": [entry(models=["o[0-9*"])]}, ("entry 'o[0-9*' has a `[` without",)),
    Case("a glob that is not a string", {"price": [entry(models=[3])]}, ("entry 3 must be a non-empty string",)),
    Case(
        "every problem at once",
        {"price": [entry(input=-1, output=...), entry(models=["x["], extra=1)]},
        (
            "price[0] (claude-sonnet-5*): field `output` is missing",
            "price[0] (claude-sonnet-5*): field `input` must not",
            "price[1] (x[): unknown field `extra`",
            "price[1] (x[): field `models` entry 'x['",
        ),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_price_entries(case: Case) -> None:
    prices, problems = check_price_entries(case.given, SOURCE)
    assert len(problems) == len(case.expect), problems
    for problem, fragment in zip(sorted(problems), sorted(case.expect)):
        assert problem.startswith(SOURCE + ": ") and fragment in problem, (problem, fragment)
    assert bool(prices) == (not problems)


GLOBS = [
    ("claude-*", None),
    ("o[0-9]*", None),
    ("a[]]b", None),
    ("a[!]]b", None),
    ("gpt-5?", None),
    ("x[", "unclosed"),
    ("x[]", "unclosed"),
    ("x[!]", "unclosed"),
    ("", "empty"),
    ("a\tb", "space"),
]


@pytest.mark.parametrize("pattern,why", GLOBS, ids=[repr(g[0]) for g in GLOBS])
def test_glob_rules(pattern: str, why: str | None) -> None:
    assert (pattern_problem(pattern) is None) == (why is None)


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "prices.toml"
    path.write_text(text)
    return str(path)


def test_file_entries_come_first_and_extend_the_shipped_table(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[[price]]\nmodels = ["claude-sonnet-4*"]\ninput = 1.0\noutput = 2.0\ncache_read = 0.1\n'
        'cache_creation = 1.5\n\n[[price]]\nmodels = ["house-model-*"]\ninput = 0\noutput = 0.5\n'
        "cache_read = 0\ncache_creation = 0\n",
    )
    table = load_prices(path)
    assert table.price[2:] == shipped_prices().price
    lookup = PriceLookup(table)
    assert lookup("claude-sonnet-4-6") == Price(
        models=("claude-sonnet-4*",), input=1.0, output=2.0, cache_read=0.1, cache_creation=1.5
    )
    assert lookup("house-model-7") is not None and price_for(shipped_prices(), "house-model-7") is None
    assert lookup("claude-opus-4-6") == price_for(shipped_prices(), "claude-opus-4-6")  # untouched
    assert load_prices(None) is shipped_prices()


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("[[price]\nmodels = 1", "cannot read prices file"),
        (
            '[[price]]\nmodels = ["a*"]\ninput = 1\noutput = 1\ncache_read = 1\n',
            "price[0] (a*): field `cache_creation` is missing",
        ),
    ],
    ids=["not TOML", "malformed entry"],
)
def test_a_bad_file_is_a_prices_error_naming_the_file(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(PricesError) as caught:
        load_price_file(path)
    assert any(p.startswith(path) and fragment in p for p in caught.value.problems), caught.value.problems


def test_a_missing_file_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(PricesError) as caught:
        load_price_file(str(tmp_path / "absent.toml"))
    assert "GATEWAY_PRICES_FILE" in str(caught.value)
