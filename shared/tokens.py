"""Virtual key format: `lhgw_{key_id}.{secret}` (SPEC §3).

`key_id` is a ULID (safe to publish); `secret` is 32 random bytes, base64url without padding.
Only `digest(token)` (sha256) is ever retained. Time and randomness are arguments, so the format
is tested by tables; `new_token()` is the one convenience that reads the clock and the OS RNG.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import time

PREFIX = "lhgw_"
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_ULID_RE = r"[0-9A-HJKMNP-TV-Z]{26}"
_TOKEN_RE = re.compile(rf"^lhgw_({_ULID_RE})\.([A-Za-z0-9_-]{{43}})$")
KEY_ID_RE = re.compile(rf"^{_ULID_RE}$")


def ulid(now_ms: int, randomness: bytes) -> str:
    """Encode a 48-bit millisecond time and 80 random bits as a 26-char Crockford ULID."""
    if len(randomness) != 10:
        raise ValueError("a ULID takes exactly 10 random bytes")
    value = ((now_ms & ((1 << 48) - 1)) << 80) | int.from_bytes(randomness, "big")
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def ulid_ms(value: str) -> int:
    """The millisecond time a ULID encodes (its first 10 characters): when a key was minted."""
    ms = 0
    for char in value[:10]:
        ms = ms * 32 + _CROCKFORD.index(char)
    return ms


def new_ulid() -> str:
    return ulid(time.time_ns() // 1_000_000, os.urandom(10))


def format_token(key_id: str, secret: bytes) -> str:
    if len(secret) != 32:
        raise ValueError("a token secret is exactly 32 bytes")
    return PREFIX + key_id + "." + base64.urlsafe_b64encode(secret).rstrip(b"=").decode("ascii")


def parse_key_id(presented: str) -> str | None:
    """The key id of a well-formed token, or None. Never echo `presented` anywhere."""
    match = _TOKEN_RE.match(presented)
    return match.group(1) if match else None


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def new_token() -> tuple[str, str, bytes]:
    """Mint a fresh `(token, key_id, digest)`."""
    key_id = new_ulid()
    token = format_token(key_id, os.urandom(32))
    return token, key_id, digest(token)
