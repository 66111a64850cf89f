"""UTC calendar windows by table: hour, day and month keys, starts and resets, at the edges."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import NamedTuple

import pytest

from controlplane.core.windows import Window, bounds_ms, hour_key, iso, key_of, window_at


def ms(stamp: str) -> int:
    return int(datetime.fromisoformat(stamp).replace(tzinfo=UTC).timestamp() * 1000)


class KeyCase(NamedTuple):
    name: str
    given: str | None
    expect: str | None


KEYS = [
    KeyCase("control's own stamp", "2026-11-30T12:34:56.789Z", "2026-11-30T12"),
    KeyCase("no milliseconds", "2026-11-30T12:34:56Z", "2026-11-30T12"),
    KeyCase("explicit UTC offset", "2026-11-30T12:34:56+00:00", "2026-11-30T12"),
    KeyCase("an offset is brought to UTC across midnight", "2026-12-01T01:30:00+02:00", "2026-11-30T23"),
    KeyCase("naive is read as UTC", "2026-11-30T12:00:00", "2026-11-30T12"),
    KeyCase("leap day", "2028-02-29T23:59:59.999Z", "2028-02-29T23"),
    KeyCase("not a stamp", "yesterday", None),
    KeyCase("absent", None, None),
]


@pytest.mark.parametrize("case", KEYS, ids=[c.name for c in KEYS])
def test_hour_key(case: KeyCase) -> None:
    assert hour_key(case.given) == case.expect


class WindowCase(NamedTuple):
    name: str
    window: Window
    at: str
    expect: tuple[str, str, str]  # key, window_start, resets_at


WINDOWS = [
    WindowCase(
        "last ms of a UTC day",
        Window.DAY,
        "2026-11-30T23:59:59.999",
        ("2026-11-30", "2026-11-30T00:00:00.000Z", "2026-12-01T00:00:00.000Z"),
    ),
    WindowCase(
        "first ms of the next UTC day",
        Window.DAY,
        "2026-12-01T00:00:00.000",
        ("2026-12-01", "2026-12-01T00:00:00.000Z", "2026-12-02T00:00:00.000Z"),
    ),
    WindowCase(
        "last ms of a month",
        Window.MONTH,
        "2026-11-30T23:59:59.999",
        ("2026-11", "2026-11-01T00:00:00.000Z", "2026-12-01T00:00:00.000Z"),
    ),
    WindowCase(
        "first ms of the next month",
        Window.MONTH,
        "2026-12-01T00:00:00.000",
        ("2026-12", "2026-12-01T00:00:00.000Z", "2027-01-01T00:00:00.000Z"),
    ),
    WindowCase(
        "December resets into January",
        Window.MONTH,
        "2026-12-31T23:59:59.999",
        ("2026-12", "2026-12-01T00:00:00.000Z", "2027-01-01T00:00:00.000Z"),
    ),
    WindowCase(
        "the leap day is a day",
        Window.DAY,
        "2028-02-29T12:00:00.000",
        ("2028-02-29", "2028-02-29T00:00:00.000Z", "2028-03-01T00:00:00.000Z"),
    ),
    WindowCase(
        "February of a leap year has 29 days",
        Window.MONTH,
        "2028-02-29T23:59:59.999",
        ("2028-02", "2028-02-01T00:00:00.000Z", "2028-03-01T00:00:00.000Z"),
    ),
    WindowCase(
        "February of a common year has 28",
        Window.DAY,
        "2027-02-28T08:00:00.000",
        ("2027-02-28", "2027-02-28T00:00:00.000Z", "2027-03-01T00:00:00.000Z"),
    ),
    WindowCase(
        "the last hour of the leap day",
        Window.HOUR,
        "2028-02-29T23:30:00.000",
        ("2028-02-29T23", "2028-02-29T23:00:00.000Z", "2028-03-01T00:00:00.000Z"),
    ),
    WindowCase(
        "an hour's last ms",
        Window.HOUR,
        "2026-11-30T12:59:59.999",
        ("2026-11-30T12", "2026-11-30T12:00:00.000Z", "2026-11-30T13:00:00.000Z"),
    ),
]


@pytest.mark.parametrize("case", WINDOWS, ids=[c.name for c in WINDOWS])
def test_window_at(case: WindowCase) -> None:
    key, start, end = window_at(case.window, ms(case.at))
    assert (key, iso(start), iso(end)) == case.expect
    assert bounds_ms(case.window, key) == (start, end)
    assert start <= ms(case.at) < end


def test_a_stamp_is_in_the_windows_its_hour_key_prefixes() -> None:
    hour = hour_key("2028-02-29T23:59:59.999Z")
    assert hour is not None
    assert [key_of(w, hour) for w in Window] == ["2028-02-29T23", "2028-02-29", "2028-02"]


def test_iso_keeps_milliseconds() -> None:
    assert iso(ms("2026-11-30T12:00:00.000") + 7) == "2026-11-30T12:00:00.007Z"
