"""UTC calendar windows (SPEC §18): the hour, the day and the month an attempt finished in.

Pure: every instant is an argument. A window is named by its *key*, the prefix of an ISO 8601
UTC stamp that spells it — `2028-02-29T13` (hour), `2028-02-29` (day), `2028-02` (month) — so a
row's three windows are three slices of its `finished_at`, a window holds a stamp when the
stamp starts with its key, and keys of one kind sort as their windows do. The row stamps the
control daemon writes (`shared.clock.iso_ms`, `...T12:34:56.789Z`) take the slicing fast path;
any other ISO 8601 form is parsed and brought to UTC first.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from enum import StrEnum


class Window(StrEnum):
    HOUR = "hour"
    DAY = "day"
    MONTH = "month"


KEY_LENGTH: dict[Window, int] = {Window.HOUR: 13, Window.DAY: 10, Window.MONTH: 7}
_KEY_FORMAT: dict[Window, str] = {Window.HOUR: "%Y-%m-%dT%H", Window.DAY: "%Y-%m-%d", Window.MONTH: "%Y-%m"}


def hour_key(stamp: str | None) -> str | None:
    """`YYYY-MM-DDTHH` (UTC) of an ISO 8601 stamp, or None when it spells no instant."""
    if stamp is None:
        return None
    if (
        len(stamp) >= 20
        and stamp[-1] == "Z"
        and stamp[4] == "-"
        and stamp[7] == "-"
        and stamp[10] == "T"
        and stamp[13] == ":"
        and stamp[:4].isdigit()
    ):
        return stamp[:13]
    try:
        moment = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime(_KEY_FORMAT[Window.HOUR])


def key_of(window: Window, hour: str) -> str:
    """The key of the `window` that holds the hour `hour` (a key of `hour_key`)."""
    return hour[: KEY_LENGTH[window]]


def key_at(window: Window, at_ms: int) -> str:
    return datetime.fromtimestamp(at_ms // 1000, UTC).strftime(_KEY_FORMAT[window])


def _start(window: Window, key: str) -> datetime:
    return datetime.strptime(key, _KEY_FORMAT[window]).replace(tzinfo=UTC)


def _next(window: Window, start: datetime) -> datetime:
    if window == Window.HOUR:
        return start + timedelta(hours=1)
    if window == Window.DAY:
        return start + timedelta(days=1)
    return start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)


def bounds_ms(window: Window, key: str) -> tuple[int, int]:
    """[start, end) of the window `key` names, in ms since the epoch; `end` is when it resets."""
    start = _start(window, key)
    return int(start.timestamp() * 1000), int(_next(window, start).timestamp() * 1000)


def window_at(window: Window, at_ms: int) -> tuple[str, int, int]:
    """(key, start_ms, resets_at_ms) of the `window` holding the instant `at_ms`."""
    key = key_at(window, at_ms)
    start, end = bounds_ms(window, key)
    return key, start, end


def iso(at_ms: int) -> str:
    """ISO 8601 UTC with milliseconds, as every stamp of the read plane (`shared.clock.iso_ms`)."""
    moment = datetime.fromtimestamp(at_ms // 1000, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at_ms % 1000:03d}Z"
