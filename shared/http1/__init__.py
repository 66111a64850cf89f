"""A small HTTP/1.1 server over `httptools` (llhttp, Node's strict parser), for both daemons:
control's API, and the data plane's proxy (issue 27: aiohttp's server cost more per request).

The parser is the dangerous part of an HTTP server, so it is a well-kept library's, not ours:
this package adds the bounds, deadlines and the request/response surface around it. It imports
no aiohttp, directly or not (a serving control holds no aiohttp module: issue 27's idle RSS).

`web` is the facade a handler module imports (`from shared.http1 import web`): the names it used
from aiohttp's `web`, kept so a handler's change is its import line. The rest, by what it holds:
`limits` (every bound and deadline), `errors` (the HTTP errors a handler raises and the server's
refusal reasons), `headers` (request headers, content type, reason phrases, Date),
`request` (a request and its body as it arrives), `response` (what goes back, on the wire),
`sse` (Server-Sent Events, aiohttp-sse's framing), `router`, `app` (routes, middlewares, state,
lifecycle hooks, the answer to what the server refused), `protocol` (one connection), `answer`
(one request answered, then the connection kept or closed), `host` (what a connection needs of
its server), `server` (listening and graceful shutdown).

The data plane uses no router: its `Application` subclass (`dataplane.main.ProxyApp`) answers
every request, and it turns on what control does without (`Server`'s `handler_cancellation`,
`hand_off` of a WebSocket handshake's connection to aiohttp, `over_cap`; `Limits`'
`max_connections` and `head_from_open`: SPEC §19).
"""
