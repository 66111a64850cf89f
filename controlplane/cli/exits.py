"""Exit codes of `leaseholdctl` and the one error type its commands raise.

Every failure ends as one line on stderr and one of these codes, never a traceback. `exec`
returns its command's own status once the command has started (128 + N when a signal N ended
it), so a script can tell the gateway's answer from its worker's.
"""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    FAILED = 1  # the control daemon refused the request (404, 422, 5xx, ...)
    USAGE = 2  # bad arguments, unreadable input file
    HELD = 3  # a mint was held (503, Retry-After): try again later
    REJECTED = 4  # a mint was rejected, or a revision conflicted (409)
    UNREACHABLE = 5  # the control daemon could not be reached
    AUTH = 6  # no token, a token refused (401) or outside its scope (403)
    UNVERIFIED = 7  # `audit --verify`: the chain verdict is neither verified nor absent


EXIT_HELP = """\
exit codes:
  0  success
  1  the control daemon refused the request (404, 422, 5xx)
  2  usage error (bad arguments, unreadable file)
  3  mint held (503): retry after the printed Retry-After
  4  mint rejected, or expected revision conflicted (409)
  5  cannot reach the control daemon (GATEWAY_CONTROL_URL)
  6  no token, token refused (401) or lacking the scope (403)
  7  audit --verify: chain verdict is not verified/absent
  exec returns its command's exit status (128+N if signal N ended it); 127 if the command
  could not be started; the codes above only before the command started.

environment:
  GATEWAY_CONTROL_URL   control daemon, else http://$GATEWAY_CONTROL_LISTEN (as in
                        gateway.env), else http://127.0.0.1:8789
  token                 --token-file, else LEASEHOLD_TOKEN, GATEWAY_CONTROL_TOKEN,
                        GATEWAY_MINT_TOKEN, GATEWAY_READ_TOKEN (first one set)
"""


class CtlError(Exception):
    """A failure the user sees as one line and an exit code."""

    def __init__(self, code: Exit, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
