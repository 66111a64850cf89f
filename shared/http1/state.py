"""Typed keys and the store they index: an application's state (`app[KEY]`), as aiohttp's
`web.AppKey` gives it. `RequestKey` keys a request's own storage (`request[KEY]`)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast, overload

T = TypeVar("T")


class AppKey(Generic[T]):
    __slots__ = ("name", "type")

    def __init__(self, name: str, t: type[T]) -> None:
        self.name, self.type = name, t

    def __repr__(self) -> str:
        return f"<AppKey {self.name}>"


RequestKey = AppKey  # per-request storage keys: the same shape


class State:
    """Values by typed key."""

    def __init__(self) -> None:
        self._state: dict[Any, Any] = {}

    def __getitem__(self, key: AppKey[T]) -> T:
        return cast(T, self._state[key])

    def __setitem__(self, key: AppKey[T], value: T) -> None:
        self._state[key] = value

    def __contains__(self, key: object) -> bool:
        return key in self._state

    @overload
    def get(self, key: AppKey[T]) -> T | None: ...
    @overload
    def get(self, key: AppKey[T], default: T) -> T: ...
    def get(self, key: AppKey[T], default: T | None = None) -> T | None:
        return cast("T | None", self._state.get(key, default))
