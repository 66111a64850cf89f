"""Routes: a method and a path of literal segments and `{name}` segments, as aiohttp's router
matches them. A path is split on its raw `/` before each segment is percent-decoded (an encoded
`%2F` stays inside its segment); a GET route answers HEAD too. No match: 404; a path matched
under another method: 405 with `Allow` (sorted, comma-joined, as aiohttp sends it).
"""

from __future__ import annotations

from typing import Any

from shared.http1.errors import HTTPMethodNotAllowed, HTTPNotFound


class Route:
    __slots__ = ("method", "path", "handler", "segments")

    def __init__(self, method: str, path: str, handler: Any) -> None:
        self.method, self.path, self.handler = method, path, handler
        self.segments = tuple(path.split("/"))


class MatchInfo(dict[str, str]):
    """The `{name}` values of the matched path; `.route.handler` is what runs (for a 404 or 405,
    a handler that raises it, with no scope mark)."""

    def __init__(self, values: dict[str, str], route: Route) -> None:
        super().__init__(values)
        self.route = route


async def _not_found(request: Any) -> Any:
    raise HTTPNotFound()


def _not_allowed(allowed: set[str]) -> Any:
    async def handler(request: Any) -> Any:
        raise HTTPMethodNotAllowed(request.method, allowed)

    return handler


class Router:
    def __init__(self) -> None:
        self._static: dict[tuple[str, ...], dict[str, Route]] = {}
        self._dynamic: list[tuple[tuple[str, ...], dict[str, Route]]] = []

    def add_route(self, method: str, path: str, handler: Any) -> Route:
        route = Route(method.upper(), path, handler)
        if any(s.startswith("{") for s in route.segments):
            table = next((m for segs, m in self._dynamic if segs == route.segments), None)
            if table is None:
                table = {}
                self._dynamic.append((route.segments, table))
        else:
            table = self._static.setdefault(route.segments, {})
        if route.method in table:
            raise ValueError(f"{route.method} {path} is already routed")
        table[route.method] = route
        return route

    def add_get(self, path: str, handler: Any) -> Route:
        self.add_route("HEAD", path, handler)
        return self.add_route("GET", path, handler)

    def add_post(self, path: str, handler: Any) -> Route:
        return self.add_route("POST", path, handler)

    def add_put(self, path: str, handler: Any) -> Route:
        return self.add_route("PUT", path, handler)

    def add_patch(self, path: str, handler: Any) -> Route:
        return self.add_route("PATCH", path, handler)

    def add_delete(self, path: str, handler: Any) -> Route:
        return self.add_route("DELETE", path, handler)

    def resolve(self, method: str, segments: tuple[str, ...]) -> MatchInfo:
        found = self._static.get(segments)
        values: dict[str, str] = {}
        if found is None:
            for pattern, table in self._dynamic:
                matched = _match(pattern, segments)
                if matched is not None:
                    found, values = table, matched
                    break
        if found is None:
            return MatchInfo({}, Route(method, "", _not_found))
        route = found.get(method)
        if route is None:
            return MatchInfo({}, Route(method, "", _not_allowed(set(found))))
        return MatchInfo(values, route)


def _match(pattern: tuple[str, ...], segments: tuple[str, ...]) -> dict[str, str] | None:
    if len(pattern) != len(segments):
        return None
    values: dict[str, str] = {}
    for want, got in zip(pattern, segments, strict=True):
        if want.startswith("{") and want.endswith("}"):
            if not got:
                return None
            values[want[1:-1]] = got
        elif want != got:
            return None
    return values
