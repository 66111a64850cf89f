"""The control ↔ data-plane RPC: length-prefixed msgpack frames over a Unix socket.

A frame is a 4-byte big-endian length followed by that many bytes of msgpack, one `Message`.
The length is checked against `FRAME_CAP` before a byte of the body is read, so a hostile or
corrupt peer cannot make us allocate. A frame that is oversized, empty or does not decode is a
`FrameError`: the connection carrying it is closed with a logged reason and the daemon lives on.

Requests carry a `req_id`; the answer is an `Ack` with the same id, resolved through a future
(`request`, awaited) or handed to a callback (`post`, nobody waits). Everything else is a push,
handed in order to the connection's handler. Frames are written coalesced, one `write` per
loop iteration (see `Connection`).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import stat
import struct
from collections.abc import Awaitable, Callable

import msgspec

from shared.logging import get_logger
from shared.wire import Ack, Acks, Message

# A snapshot of every live lease is the largest frame; 32 MiB holds ~150k leases.
FRAME_CAP = 32 * 1024 * 1024
_HEADER = struct.Struct(">I")
# One read takes whatever the socket holds, up to this.
READ_SIZE = 256 * 1024
# How long a lazy frame may wait for others to share its write.
LAZY_FLUSH_S = 0.010

log = get_logger("rpc")

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


class FrameError(Exception):
    """A peer sent something that is not a valid frame; `reason` is a short code."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def encode_frame(message: Message) -> bytes:
    body = _encoder.encode(message)
    if len(body) > FRAME_CAP:
        raise FrameError("frame-too-large")
    return _HEADER.pack(len(body)) + body


def check_length(header: bytes) -> int:
    return check_length_at(header, 0)


def check_length_at(buffer: bytes | bytearray, offset: int) -> int:
    """The body length announced by the header at `offset`, refused if empty or over the cap."""
    length: int
    (length,) = _HEADER.unpack_from(buffer, offset)
    if length == 0:
        raise FrameError("empty-frame")
    if length > FRAME_CAP:
        raise FrameError("frame-too-large")
    return length


def decode_body(body: bytes | bytearray) -> Message:
    try:
        return _decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise FrameError("malformed-frame") from exc


def split_frames(buffer: bytes) -> tuple[list[Message], bytes]:
    """Pure framing over a byte buffer: every whole message in it, and the unread rest."""
    messages: list[Message] = []
    offset = 0
    while len(buffer) - offset >= _HEADER.size:
        length = check_length(buffer[offset : offset + _HEADER.size])
        end = offset + _HEADER.size + length
        if len(buffer) < end:
            break
        messages.append(decode_body(buffer[offset + _HEADER.size : end]))
        offset = end
    return messages, buffer[offset:]


# A push's handler: a coroutine function, or a plain one when it never suspends (no coroutine
# is then made and awaited per frame: control takes each report at once).
Handler = Callable[["Connection", Message], Awaitable[None] | None]


class Connection:
    """One RPC peer: ordered pushes to `handler`, `request()` resolved by `Ack`.

    Frames sent in one event-loop iteration are coalesced: `send_nowait` appends to a buffer
    and one callback (`call_soon`) writes them all with a single `write`, so a burst of reports
    costs one syscall and one wake-up of the peer instead of one per frame; reports nobody
    waits for are sent `lazy` and wait a little longer for company. `send` flushes at
    once (the handshake and anything written after it stay in order), and so does the reader
    after `read_done` (control's Acks leave in its turn, with no callback). Reading takes whatever
    the socket holds and splits every whole frame out of it, the length checked against
    `FRAME_CAP` before the body is waited for.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str) -> None:
        self.reader = reader
        self.writer = writer
        self._transport = writer.transport  # `writer.write` and `is_closing` are its, one call less
        self.name = name
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Ack]] = {}
        self._callbacks: dict[int, Callable[[Ack | None], None]] = {}
        self._out: list[bytes | Message] = []  # a withdrawable frame stays unencoded
        self._withdrawable: dict[str, int] = {}  # its key → its place in `_out`
        self._soon = False  # a flush is due this iteration
        self._timer: asyncio.TimerHandle | None = None  # a flush is due for lazy frames
        self._in_turn = False  # `run` is in `read_done`: it flushes after it (no `call_soon`)
        self._closed = False  # `closed.is_set()`, without the call
        self.closed = asyncio.Event()

    def next_id(self) -> int:
        return next(self._ids)

    async def read_message(self) -> Message:
        header = await self.reader.readexactly(_HEADER.size)
        body = await self.reader.readexactly(check_length(header))
        return decode_body(body)

    def send_nowait(self, message: Message, *, lazy: bool = False, encoded: bool = True) -> None:
        """Queue one frame; it is written with the others of this loop iteration.

        A `lazy` frame (a report nobody waits for) may wait up to `LAZY_FLUSH_S` for company:
        a short request's two reports then leave together after its answer, off its critical
        path, and under load many requests share one write and one wake-up of the peer. Any
        other frame sent meanwhile takes the lazy ones along. Order is kept either way.
        """
        if self._closed or self._transport.is_closing():
            raise ConnectionError("rpc connection closed")
        self._out.append(encode_frame(message) if encoded else message)
        if self._soon:
            return
        if not lazy:
            self._soon = True
            if not self._in_turn:  # else `run` flushes when `read_done` returns, in this turn
                asyncio.get_running_loop().call_soon(self.flush)
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(LAZY_FLUSH_S, self.flush)

    def send_withdrawable(self, key: str, message: Message) -> None:
        """Queue a lazy frame that `withdraw(key)` can still take back until it is flushed; it
        is encoded only then (issue 27: an attempt that ends within the lazy window is reported
        once, by its finished row, instead of started + finished)."""
        self.send_nowait(message, lazy=True, encoded=False)
        self._withdrawable[key] = len(self._out) - 1

    def withdraw(self, key: str) -> bool:
        """Take back the unflushed frame queued under `key`; False when it already left."""
        at = self._withdrawable.pop(key, None)
        if at is None:
            return False
        self._out[at] = b""
        return True

    def flush(self) -> None:
        """Write every queued frame now, in one `write`."""
        self._soon = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        out = self._out
        if not out:
            return
        self._out = []
        if self._withdrawable:
            self._withdrawable.clear()
            out = [frame if isinstance(frame, bytes) else encode_frame(frame) for frame in out]
        if self._transport.is_closing():
            return
        self._transport.write(out[0] if len(out) == 1 else b"".join(out))  # type: ignore[arg-type]

    async def send(self, message: Message) -> None:
        self.send_nowait(message)
        self.flush()
        await self.writer.drain()

    def post(self, build: Callable[[int], Message], on_ack: Callable[[Ack | None], None], *, lazy: bool = False) -> int:
        """Send `build(req_id)` without waiting: `on_ack` gets its Ack, or None if the link is lost."""
        req_id = self.next_id()
        self.send_nowait(build(req_id), lazy=lazy)
        self._callbacks[req_id] = on_ack
        return req_id

    async def request(self, build: Callable[[int], Message], timeout_s: float) -> Ack:
        """Send the message `build(req_id)` and wait for its Ack (ConnectionError if lost)."""
        req_id = self.next_id()
        future: asyncio.Future[Ack] = asyncio.get_running_loop().create_future()
        self._pending[req_id] = future
        try:
            self.send_nowait(build(req_id))
            if self._over_high_water():
                self.flush()
                await self.writer.drain()
            async with asyncio.timeout(timeout_s):
                return await future
        finally:
            self._pending.pop(req_id, None)

    def _over_high_water(self) -> bool:
        transport = self.writer.transport
        return transport.get_write_buffer_size() > transport.get_write_buffer_limits()[1]

    def _on_ack(self, ack: Ack) -> None:
        future = self._pending.get(ack.req_id)
        if future is not None:
            if not future.done():
                future.set_result(ack)
            return
        callback = self._callbacks.pop(ack.req_id, None)
        if callback is not None:
            callback(ack)

    async def run(self, handler: Handler, read_done: Callable[[], None] | None = None) -> None:
        """Read until the peer goes away; a bad frame closes this connection, logged.
        `read_done` is called after the pushes of each read were handled (and once more at the
        end): control settles them there, in the reader's turn of the loop."""
        read = self.reader.read
        on_ack = self._on_ack
        rest = bytearray()  # the start of a frame whose end has not arrived yet
        try:
            while True:
                data: bytes | bytearray = await read(READ_SIZE)
                if not data:
                    break
                if rest:
                    rest += data
                    data = rest
                offset, size = 0, len(data)
                while size - offset >= _HEADER.size:
                    end = offset + _HEADER.size + check_length_at(data, offset)
                    if end > size:
                        break
                    message = decode_body(data[offset + _HEADER.size : end])
                    offset = end
                    if isinstance(message, Ack):
                        on_ack(message)
                    elif isinstance(message, Acks):
                        for req_id in message.req_ids:
                            on_ack(Ack(req_id=req_id, ok=message.ok))
                    else:
                        pending = handler(self, message)
                        if pending is not None:
                            await pending
                if read_done is not None:
                    self._in_turn = True  # the Acks it sends are written right after it, not a turn later
                    try:
                        read_done()
                    finally:
                        self._in_turn = False
                    if self._soon:
                        self.flush()
                if data is rest:
                    del rest[:offset]
                elif offset < size:
                    rest += data[offset:]
        except FrameError as exc:
            log.warning("rpc_frame_rejected", peer=self.name, reason=exc.reason)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            if read_done is not None:
                read_done()  # what a read cut short by a bad frame handled is settled too
            self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.closed.set()
        if self._out and not self._transport.is_closing():
            self.flush()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionError("rpc connection lost"))
        self._pending.clear()
        callbacks, self._callbacks = self._callbacks, {}
        for callback in callbacks.values():
            callback(None)
        self.writer.close()


def acks_by_connection(unacked: list[tuple[Connection, int]]) -> dict[Connection, list[int]]:
    """The request ids to acknowledge, per connection, in the order they came."""
    grouped: dict[Connection, list[int]] = {}
    for conn, req_id in unacked:
        ids = grouped.get(conn)
        if ids is None:
            grouped[conn] = [req_id]
        else:
            ids.append(req_id)
    return grouped


def send_acks(unacked: list[tuple[Connection, int]], ok: bool) -> None:
    """Acknowledge rows with one frame per connection (issue 27), `ok` in each; a connection
    gone is passed over (its peer re-sends what it did not see acknowledged)."""
    if len(unacked) == 1:  # a settle of one row (a link not saturated): its `Ack`, nothing to group
        conn, req_id = unacked[0]
        try:
            conn.send_nowait(Ack(req_id=req_id, ok=ok))
        except ConnectionError:
            pass
        return
    for conn, req_ids in acks_by_connection(unacked).items():
        try:
            conn.send_nowait(Ack(req_id=req_ids[0], ok=ok) if len(req_ids) == 1 else Acks(req_ids=req_ids, ok=ok))
        except ConnectionError:
            pass


# ---- socket security (SPEC §13) -------------------------------------------------------------


def prepare_socket_dir(socket_path: str) -> None:
    """Make the socket's directory exist as 0700 and owned by us; refuse a shared directory."""
    directory = os.path.dirname(os.path.abspath(socket_path))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    info = os.stat(directory)
    if info.st_uid != os.getuid():
        raise PermissionError(f"RPC socket directory {directory} is not owned by this user")
    if info.st_mode & stat.S_ISVTX:
        raise PermissionError(f"RPC socket directory {directory} is shared (sticky); use a private one")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(directory, 0o700)


def peer_uid(writer: asyncio.StreamWriter) -> int | None:
    sock = writer.get_extra_info("socket")
    if sock is None:
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    uid: int
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


async def start_unix_server(
    socket_path: str,
    on_client: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> asyncio.AbstractServer:
    """Bind `socket_path` as 0600 inside a 0700 directory (no window where it is wider)."""
    prepare_socket_dir(socket_path)
    try:
        os.unlink(socket_path)
    except FileNotFoundError:
        pass
    previous = os.umask(0o177)
    try:
        server = await asyncio.start_unix_server(on_client, path=socket_path, limit=FRAME_CAP + 8)
    finally:
        os.umask(previous)
    os.chmod(socket_path, 0o600)
    return server
