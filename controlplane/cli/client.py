"""A tiny synchronous HTTP client for the control API (urllib, no proxies).

Where to go (SPEC §1): `GATEWAY_CONTROL_URL`, else `http://$GATEWAY_CONTROL_LISTEN` (the
daemon's own listen address, so an operator who sourced `gateway.env` needs nothing more; an
every-interface bind is reached on loopback), else `http://127.0.0.1:8789`. Which bearer (SPEC
§19: never from the command line, where the process listing shows it): `--token-file`'s file,
else the first of `LEASEHOLD_TOKEN`, `GATEWAY_CONTROL_TOKEN`, `GATEWAY_MINT_TOKEN`,
`GATEWAY_READ_TOKEN` that is set. The token's *source* (never its value) is remembered so a
401/403 can name the variable to fix. Proxy variables are ignored on purpose: the bearer token
must not travel through an `http_proxy` to a loopback daemon.

`failure_of(reply, ...)` is the pure mapping from an unwanted answer to one line + exit code.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlencode, urlsplit

import msgspec

from controlplane.cli.exits import CtlError, Exit
from shared.codes import Scope
from shared.listen import url_of_listen

DEFAULT_URL = "http://127.0.0.1:8789"
URL_VAR = "GATEWAY_CONTROL_URL"
LISTEN_VAR = "GATEWAY_CONTROL_LISTEN"
TOKEN_VARS = ("LEASEHOLD_TOKEN", "GATEWAY_CONTROL_TOKEN", "GATEWAY_MINT_TOKEN", "GATEWAY_READ_TOKEN")
TOKEN_FILE_FLAG = "--token-file"
TOKEN_FILE_CAP = 4096  # a bearer token is a line; a bigger file is not one
REFUSED_TOKEN_FLAG = (
    "--token is refused: a token on the command line is visible in the process "
    "listing; use --token-file PATH or set GATEWAY_CONTROL_TOKEN (or LEASEHOLD_TOKEN, "
    "GATEWAY_MINT_TOKEN, GATEWAY_READ_TOKEN)"
)
TIMEOUT_S = 60.0  # a mint waits for the data plane's acknowledgement; revoke-leases may be slow

# The token variable that carries each scope, for "use X instead" hints.
VAR_FOR_SCOPE: dict[Scope, str] = {
    Scope.ADMIN: "GATEWAY_CONTROL_TOKEN",
    Scope.MINT: "GATEWAY_MINT_TOKEN or GATEWAY_CONTROL_TOKEN",
    Scope.READ: "GATEWAY_READ_TOKEN, GATEWAY_MINT_TOKEN or GATEWAY_CONTROL_TOKEN",
}


class TokenChoice(msgspec.Struct, frozen=True):
    value: str | None
    source: str  # "--token-file", an env var name, or "" when none was found


class Reply(msgspec.Struct, frozen=True):
    status: int
    headers: dict[str, str]
    body: Any


def read_token_file(path: str) -> str:
    """The token in `path`: its first line, surrounding whitespace stripped."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(TOKEN_FILE_CAP + 1)
    except OSError as exc:
        raise CtlError(Exit.AUTH, f"cannot read {TOKEN_FILE_FLAG} {path}: {exc.strerror}") from None
    lines = raw.decode("utf-8", "replace").strip().splitlines()
    if len(raw) > TOKEN_FILE_CAP or len(lines) != 1 or not lines[0].strip():
        raise CtlError(Exit.AUTH, f"{TOKEN_FILE_FLAG} {path} must hold one token on one line")
    return lines[0].strip()


def choose_token(from_file: str | None, env: Mapping[str, str]) -> TokenChoice:
    """`from_file`: the token `--token-file` read (it wins), or None."""
    if from_file:
        return TokenChoice(from_file, TOKEN_FILE_FLAG)
    for name in TOKEN_VARS:
        value = env.get(name, "").strip()
        if value:
            return TokenChoice(value, name)
    return TokenChoice(None, "")


def control_url(env: Mapping[str, str]) -> str:
    """`GATEWAY_CONTROL_URL`, else `http://$GATEWAY_CONTROL_LISTEN`, else the default."""
    raw = env.get(URL_VAR, "").strip()
    if not raw:
        listen = env.get(LISTEN_VAR, "").strip()
        if not listen:
            return DEFAULT_URL
        try:
            return url_of_listen(listen)
        except ValueError:
            raise CtlError(Exit.USAGE, f"{LISTEN_VAR}={listen!r} is not HOST:PORT; set {URL_VAR} instead") from None
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise CtlError(Exit.USAGE, f"{URL_VAR}={raw!r} is not an http(s) URL")
    return raw.rstrip("/")


def error_of(body: Any) -> tuple[str, str, dict[str, Any]]:
    """(code, message, extra fields) of a control error body `{"error": {code, message, ...}}`."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = dict(body["error"])
        return str(error.pop("code", "")), str(error.pop("message", "")), error
    if isinstance(body, dict) and "refusal_reason" in body:
        return str(body["refusal_reason"]), str(body.get("outcome", "")), {}
    text = body.strip() if isinstance(body, str) else ""
    return "", text[:200], {}


def failure_of(reply: Reply, scope: Scope, token: TokenChoice, path: str) -> CtlError:
    """One line and an exit code for an answer the command did not want."""
    code, message, extra = error_of(reply.body)
    status = reply.status
    said = f"{status} {code}".strip()
    if status == 401:
        return CtlError(
            Exit.AUTH,
            f"the control daemon refused the token from {token.source} ({said}): "
            f"this command needs scope {scope}; check {token.source} "
            f"(a token of {VAR_FOR_SCOPE[scope]})",
        )
    if status == 403:
        return CtlError(
            Exit.AUTH,
            f"the token from {token.source} lacks scope {scope} ({said}: {message}); use {VAR_FOR_SCOPE[scope]}",
        )
    if status == 404 and not code:
        return CtlError(
            Exit.FAILED,
            f"the control daemon does not serve {path} (404): is leasehold-control older than this leaseholdctl?",
        )
    if status == 409 and "current_revision" in extra:
        return CtlError(
            Exit.REJECTED,
            f"revision conflict ({said}): the current revision is "
            f"{extra['current_revision']}, not {extra.get('expected_revision')}; "
            "read it again and retry",
        )
    if status == 409:
        return CtlError(Exit.REJECTED, f"refused ({said}): {message}")
    if status == 422:
        return CtlError(Exit.FAILED, f"refused ({said}): {message}")
    return CtlError(Exit.FAILED, f"the control daemon answered {said}" + (f": {message}" if message else ""))


class Client:
    def __init__(self, url: str, token: TokenChoice, timeout_s: float = TIMEOUT_S) -> None:
        self.url = url
        self.token = token
        self.timeout_s = timeout_s
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    @classmethod
    def from_env(cls, env: Mapping[str, str], token_file: str | None) -> Client:
        return cls(control_url(env), choose_token(None if token_file is None else read_token_file(token_file), env))

    # ---- one exchange -------------------------------------------------------------------

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> Reply:
        """One request; any HTTP status is a `Reply`, an unreachable daemon a `CtlError`."""
        request = self._request(method, path, query, body)
        try:
            with self._opener.open(request, timeout=timeout_s or self.timeout_s) as response:
                status, raw, headers = response.status, response.read(), response.headers
        except urllib.error.HTTPError as err:
            status, raw, headers = err.code, err.read(), err.headers
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise self.unreachable(exc) from None
        return Reply(status, {k.lower(): v for k, v in headers.items()}, _decode(raw))

    def expect(self, reply: Reply, scope: Scope, path: str, ok: tuple[int, ...] = (200, 201)) -> Any:
        if reply.status in ok:
            return reply.body
        raise failure_of(reply, scope, self.token, path)

    def get(self, path: str, scope: Scope, query: Mapping[str, Any] | None = None) -> Any:
        return self.expect(self.call("GET", path, query=query), scope, path)

    @contextmanager
    def stream(self, path: str, scope: Scope, headers: Mapping[str, str], timeout_s: float) -> Iterator[Any]:
        """An open streaming response (for SSE); refusals are raised as for `expect`."""
        request = self._request("GET", path, None, None)
        for name, value in headers.items():
            request.add_header(name, value)
        try:
            response = self._opener.open(request, timeout=timeout_s)
        except urllib.error.HTTPError as err:
            reply = Reply(err.code, {k.lower(): v for k, v in err.headers.items()}, _decode(err.read()))
            raise failure_of(reply, scope, self.token, path) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise self.unreachable(exc) from None
        with response:
            yield response

    def unreachable(self, exc: BaseException) -> CtlError:
        reason = getattr(exc, "reason", None) or exc
        if isinstance(reason, TimeoutError):
            reason = f"no answer within {self.timeout_s:g}s"
        return CtlError(
            Exit.UNREACHABLE,
            f"cannot reach the control daemon at {self.url}: {reason} "
            f"— is leasehold-control running? set {URL_VAR} "
            f"(or {LISTEN_VAR}, as in gateway.env)",
        )

    def _request(self, method: str, path: str, query: Mapping[str, Any] | None, body: Any) -> urllib.request.Request:
        if self.token.value is None:
            raise CtlError(
                Exit.AUTH,
                "no control token: pass --token-file or set " + ", ".join(TOKEN_VARS[:-1]) + " or " + TOKEN_VARS[-1],
            )
        url = self.url + path
        if query:
            url += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token.value}")
        request.add_header("User-Agent", "leaseholdctl")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        return request


def _decode(raw: bytes) -> Any:
    text = raw.decode("utf-8", "replace")
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text
