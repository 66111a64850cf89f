"""`shared.http1`'s pure pieces against what aiohttp (and yarl, and the `email` package) answer
for the same input: the content type a handler sees, the query, the Date value, and routing."""

from __future__ import annotations

import email.utils
from enum import StrEnum
from typing import Any

import pytest
import yarl
from aiohttp.helpers import parse_content_type
from multidict import CIMultiDict, istr

from shared.http1 import response
from shared.http1.errors import HTTPMethodNotAllowed, HTTPNotFound
from shared.http1.headers import Headers, content_type_of, imf_fixdate
from shared.http1.request import Body, Request
from shared.http1.response import header_lines, status_line
from shared.http1.router import Router
from shared.http1.state import State

CONTENT_TYPES = [
    "application/json",
    "application/json; charset=utf-8",
    "APPLICATION/JSON",
    " application/json ",
    "text/plain",
    "",
    "json",
    "application/json;",
    "a/b/c",
    "multipart/form-data; boundary=x",
]


@pytest.mark.parametrize("raw", CONTENT_TYPES)
def test_the_content_type_is_aiohttps(raw: str) -> None:
    assert content_type_of(raw) == parse_content_type(raw)[0]


def test_no_content_type_is_octet_stream_as_in_aiohttp() -> None:
    assert content_type_of(None) == "application/octet-stream"


QUERIES = ["a=1&b=2", "a=1&a=2", "x=%ZZ&y", "name=%FF", "q=a+b%20c", "", "=v&k=", "k=v=w", "a=1;b=2"]


class _Conn:
    transport = remote = None


def request_for(target: bytes, headers: list[tuple[str, str]] | None = None) -> Request:
    body = Body(None, declared=None, expects_continue=False, limit_s=1, buffer_bytes=1)  # type: ignore[arg-type]
    return Request(
        method="GET",
        version=(1, 1),
        target=target,
        headers=Headers(headers or []),
        body=body,
        keep_alive=True,
        conn=_Conn(),
        app=State(),
        max_body=0,
    )


@pytest.mark.parametrize("query", QUERIES)
def test_the_query_is_yarls_first_values(query: str) -> None:
    theirs = yarl.URL("/p?" + query).query
    ours = request_for(f"/p?{query}".encode()).query
    assert ours == {k: theirs[k] for k in theirs}


@pytest.mark.parametrize(
    ("target", "path"),
    [(b"/healthz", "/healthz"), (b"/heal%74hz", "/healthz"), (b"http://h:1/a/b?x=1", "/a/b"), (b"/a%20b", "/a b")],
)
def test_the_path_is_decoded_as_yarl_decodes_it(target: bytes, path: str) -> None:
    assert request_for(target).path == path


@pytest.mark.parametrize("epoch_s", [0, 1_700_000_000, 1_798_000_000, 951_782_400])
def test_the_date_value_is_imf_fixdate(epoch_s: int) -> None:
    assert imf_fixdate(epoch_s) == email.utils.formatdate(epoch_s, usegmt=True)


def test_headers_are_case_insensitive_and_keep_repeats() -> None:
    headers = Headers([("Authorization", "Bearer a"), ("X-Many", "1"), ("x-many", "2")])
    assert headers.get("authorization") == "Bearer a" and headers["AUTHORIZATION"] == "Bearer a"
    assert headers.get("x-MANY") == "1" and headers.getall("X-Many") == ["1", "2"]
    assert "x-many" in headers and "Missing" not in headers and headers.get("Missing", "d") == "d"


def test_header_look_ups_by_any_name_past_the_remembered_bound() -> None:
    """`Headers.get` and `in` remember each looked-up name's lower case (bounded): any number
    of names, in any spelling, answer as `name.lower()` would, before and after the clear."""
    from shared.http1 import headers as module

    items = [(f"X-Name-{i}", str(i)) for i in range(3 * module.LOWERED_MAX)] + [("", "empty")]
    headers = Headers(items)
    for _ in range(2):
        for i in range(3 * module.LOWERED_MAX):
            for spelling in (f"x-name-{i}", f"X-NAME-{i}", f"X-Name-{i}"):
                assert headers.get(spelling) == str(i) and spelling in headers
            assert headers.get(f"x-other-{i}") is None and f"X-Other-{i}" not in headers
        assert headers.get("") == "empty" and "" in headers and 3 not in headers  # type: ignore[operator]
        assert len(module._lowered_names) <= module.LOWERED_MAX


async def h_get(request: Any) -> Any: ...
async def h_put(request: Any) -> Any: ...
async def h_key(request: Any) -> Any: ...


ROUTES = [
    ("GET", "/healthz", h_get, {}),
    ("HEAD", "/healthz", h_get, {}),
    ("PUT", "/level", h_put, {}),
    ("GET", "/level", h_get, {}),
    ("DELETE", "/keys/abc", h_key, {"key_id": "abc"}),
    ("DELETE", "/keys/a%20b", h_key, {"key_id": "a b"}),
]


def router() -> Router:
    made = Router()
    made.add_get("/healthz", h_get)
    made.add_get("/level", h_get)
    made.add_put("/level", h_put)
    made.add_delete("/keys/{key_id}", h_key)
    return made


@pytest.mark.parametrize(("method", "target", "handler", "values"), ROUTES, ids=[f"{r[0]} {r[1]}" for r in ROUTES])
def test_routes_resolve_to_their_handler_and_values(method: str, target: str, handler: Any, values: dict) -> None:
    match = router().resolve(method, request_for(target.encode()).segments)
    assert match.route.handler is handler and dict(match) == values


@pytest.mark.parametrize(
    ("method", "target", "allow"),
    [
        ("GET", "/nope", None),
        ("GET", "/healthz/", None),
        ("GET", "/keys/a%2Fb/x", None),
        ("GET", "/keys/", None),
        ("POST", "/healthz", "GET,HEAD"),
        ("DELETE", "/level", "GET,HEAD,PUT"),
    ],
)
async def test_no_route_is_404_and_a_wrong_method_405_with_allow(method: str, target: str, allow: str | None) -> None:
    match = router().resolve(method, request_for(target.encode()).segments)
    assert not hasattr(match.route.handler, "__leasehold_scope__")
    with pytest.raises(HTTPMethodNotAllowed if allow else HTTPNotFound) as raised:
        await match.route.handler(request_for(target.encode()))
    assert raised.value.headers.get("Allow") == allow


def test_a_route_added_twice_is_refused() -> None:
    made = router()
    with pytest.raises(ValueError):
        made.add_get("/healthz", h_put)


class _Kind(StrEnum):
    JSON = "application/json"


HEADER_SETS: list[Any] = [
    CIMultiDict([("Content-Type", "application/json"), ("x-a", "1"), ("X-A", "2"), ("x-empty", "")]),
    {"Allow": "GET, HEAD", "Retry-After": 1, "X-None": None},  # not str: formatted
    CIMultiDict([(istr("Content-Type"), _Kind.JSON), ("x-n", 3)]),
    {istr("Server-Timing"): "a;dur=1.5", "X-Kind": _Kind.JSON},
    {},
]


@pytest.mark.parametrize("headers", HEADER_SETS)
def test_header_lines_are_each_header_formatted(headers: Any) -> None:
    assert header_lines(headers) == [f"{name}: {value}" for name, value in headers.items()]


@pytest.mark.parametrize(
    ("version", "status", "reason"),
    [
        ((1, 1), 200, "OK"),
        ((1, 0), 200, "OK"),
        ((1, 1), 429, "Too Many Requests"),
        ((1, 1), 529, ""),
        ((1, 1), 200, "Fine"),
    ],
)
def test_the_status_line_is_formatted_once_and_the_same(version: tuple[int, int], status: int, reason: str) -> None:
    expected = f"HTTP/{version[0]}.{version[1]} {status} {reason}"
    assert status_line(version, status, reason) == expected
    assert status_line(version, status, reason) == expected  # (from the memo)


def test_the_status_line_memo_is_bounded() -> None:
    for n in range(response.STATUS_LINES_MAX * 2):
        assert status_line((1, 1), 200, f"reason {n}") == f"HTTP/1.1 200 reason {n}"
    assert len(response._status_lines) <= response.STATUS_LINES_MAX
    long = "x" * (response.REASON_KEPT_MAX + 1)  # a peer's long reason phrase: never kept
    assert status_line((1, 1), 200, long) == f"HTTP/1.1 200 {long}"
    assert ((1, 1), 200, long) not in response._status_lines
