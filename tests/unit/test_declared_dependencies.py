"""Every distribution the shipped packages import is declared in setup.cfg, every declared one
is imported, and requirements-test.txt (the lock `make test` installs from) pins each declared
distribution at a release inside its declared range.

An import that works only because another package happens to pull its distribution in (multidict
and yarl come with aiohttp) breaks the day that package stops doing so; this test names it first.
"""

from __future__ import annotations

import ast
import configparser
import functools
import importlib.metadata
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("shared", "controlplane", "dataplane")


def imported_top_levels() -> set[str]:
    names: set[str] = set()
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in PACKAGES}


def declared(section: str, option: str) -> dict[str, Requirement]:
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    lines = (line.split("#")[0].strip() for line in config[section][option].splitlines())
    requirements = [Requirement(line) for line in lines if line]
    return {canonicalize_name(r.name): r for r in requirements}


def locked() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements-test.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"requirements-test.txt: {line!r} is not an exact pin"
            pins[canonicalize_name(name)] = version.strip()
    return pins


@functools.cache
def installed_top_levels() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def distributions_of(top_level: str) -> set[str]:
    found = installed_top_levels().get(top_level)
    assert found, f"{top_level} is imported but no installed distribution provides it"
    return {canonicalize_name(d) for d in found}


def test_every_imported_distribution_is_declared() -> None:
    runtime = declared("options", "install_requires")
    imported = imported_top_levels()
    assert {"aiohttp", "msgspec", "multidict", "yarl"} <= imported  # the sweep is not vacuous
    missing = {top: sorted(distributions_of(top)) for top in imported if not distributions_of(top) & set(runtime)}
    assert not missing, f"imported but not in setup.cfg's install_requires: {missing}"


def test_every_declared_distribution_is_imported() -> None:
    provided = set().union(*(distributions_of(top) for top in imported_top_levels()))
    unused = sorted(set(declared("options", "install_requires")) - provided)
    assert not unused, f"declared in install_requires but imported by no shipped module: {unused}"


def test_the_lock_pins_every_declared_distribution_inside_its_range() -> None:
    pins = locked()
    wanted = {**declared("options", "install_requires"), **declared("options.extras_require", "test")}
    outside = {
        name: (str(req.specifier), pins.get(name))
        for name, req in wanted.items()
        if name not in pins or not req.specifier.contains(pins[name], prereleases=True)
    }
    assert not outside, f"requirements-test.txt misses or pins outside setup.cfg's range: {outside}"


def test_the_installed_releases_are_the_locked_ones() -> None:
    """`make test` installs from the lock, so what runs is what it names."""
    drift = {}
    for name, version in locked().items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # a platform-conditional pin this interpreter does not install
        if installed != version:
            drift[name] = (version, installed)
    assert not drift, f"installed releases differ from requirements-test.txt (re-run `make venv`): {drift}"
