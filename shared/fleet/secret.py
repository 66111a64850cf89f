"""The fleet secret (SPEC §19): one file's bytes, shared by every host, and the keys made from it.

Redis is trusted for availability, not for integrity: what a host reads back from it is
believed only when it carries a MAC made with a key a Redis writer does not have. Every host of
a fleet reads the same secret file (`GATEWAY_FLEET_SECRET_FILE`, read and checked by
`shared/settings.py`) and derives one key per use, `HMAC-SHA256(secret, label)`, so a MAC made
for one use (a chain record, a revoke request, a spend total) never verifies as another, and
the fleet id in every label keeps two fleets that share a secret apart.

A MAC covers a tuple of fields encoded with msgpack (unambiguous: lengths and types are part
of the bytes) and is written as unpadded base64url, 43 characters. Pure: no I/O, no Redis.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import stat
from collections.abc import Sequence
from typing import Any

import msgspec

MIN_BYTES = 32  # SPEC §19: at least 32 random bytes
MAX_BYTES = 64 * 1024  # a secret file is small; a bigger one is a wrong path
LABEL_PREFIX = b"leasehold-fleet/v1/"
_ENCODER = msgspec.msgpack.Encoder()


class FleetSecret:
    """The secret's bytes, never shown: `repr` and `str` say only that it is there."""

    __slots__ = ("_material",)

    def __init__(self, material: bytes) -> None:
        if len(material) < MIN_BYTES:
            raise ValueError(f"a fleet secret holds at least {MIN_BYTES} bytes")
        self._material = bytes(material)

    def key(self, fleet_id: str, use: str) -> bytes:
        """The key for one use (`chain/policy`, `entry/revoke`, ...) in one fleet."""
        label = LABEL_PREFIX + fleet_id.encode() + b"/" + use.encode()
        return hmac.new(self._material, label, hashlib.sha256).digest()

    def __repr__(self) -> str:
        return "FleetSecret(<redacted>)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FleetSecret) and hmac.compare_digest(self._material, other._material)

    def __hash__(self) -> int:
        return hash(hashlib.sha256(self._material).digest())


class Keyring:
    """One host's keys, one per use, derived once from the fleet secret and the fleet id.

    During a rotation (`GATEWAY_FLEET_VERIFY_SECRET_FILE`, README "Rotating the fleet secret")
    a second secret's keys are accepted when verifying (`keys`), never used to make a MAC (`key`)."""

    def __init__(self, secret: FleetSecret, fleet_id: str, verify_also: FleetSecret | None = None) -> None:
        self._secret = secret
        self._fleet_id = fleet_id
        self._also = verify_also if verify_also is not None and verify_also != secret else None
        self._keys: dict[str, bytes] = {}
        self._accepted: dict[str, tuple[bytes, ...]] = {}

    def key(self, use: str) -> bytes:
        """The key this host makes its MACs with."""
        key = self._keys.get(use)
        if key is None:
            key = self._keys[use] = self._secret.key(self._fleet_id, use)
        return key

    def keys(self, use: str) -> tuple[bytes, ...]:
        """Every key a MAC may verify under: this host's, then the rotation's other one."""
        keys = self._accepted.get(use)
        if keys is None:
            also = () if self._also is None else (self._also.key(self._fleet_id, use),)
            keys = self._accepted[use] = (self.key(use), *also)
        return keys

    def __repr__(self) -> str:
        return f"Keyring({self._fleet_id!r}, <redacted>)"


def mac(key: bytes, fields: Sequence[Any]) -> str:
    """The MAC of `fields` (str, bytes, int, float, bool, None, nested lists) under `key`."""
    digest = hmac.new(key, _ENCODER.encode(list(fields)), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def verify(key: bytes | Sequence[bytes], fields: Sequence[Any], presented: object) -> bool:
    """Whether `presented` is the MAC of `fields` under `key` (or under any of several keys, a
    rotation's two); constant time per key; anything not a str is False."""
    if not isinstance(presented, str) or len(presented) != 43:
        return False
    keys = (key,) if isinstance(key, bytes) else key
    return any(hmac.compare_digest(mac(k, fields), presented) for k in keys)


def read_secret_file(path: str, name: str) -> tuple[FleetSecret | None, str | None]:
    """Read a secret file: (the secret, None), or (None, the problem naming the variable `name`).

    Refused: a path that is not a readable regular file, a mode other than 0400 or 0600 (a
    symlink is followed: secret managers mount them), fewer than `MIN_BYTES` bytes. The problem
    never quotes the file's content.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        return None, f"{name}={path!r} cannot be opened ({exc.strerror})"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, f"{name}={path!r} is not a regular file"
        mode = stat.S_IMODE(info.st_mode)
        if mode not in (0o400, 0o600):
            return None, f"{name}={path!r} has mode {mode:04o}; it must be 0400 or 0600"
        chunks, size = [], 0
        while size <= MAX_BYTES:
            chunk = os.read(fd, 8192)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        return None, f"{name}={path!r} cannot be read ({exc.strerror})"
    finally:
        os.close(fd)
    material = b"".join(chunks)
    if len(material) < MIN_BYTES:
        return None, f"{name}={path!r} holds {len(material)} bytes; it must hold at least {MIN_BYTES}"
    if len(material) > MAX_BYTES:
        return None, f"{name}={path!r} holds more than {MAX_BYTES} bytes; is it the secret file?"
    return FleetSecret(material), None
