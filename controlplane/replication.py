"""The control side of the RPC: one data plane, its lease replica kept exact.

On connect: peer uid check → `Hello`/`Welcome` version handshake → `Snapshot` of every live
lease and account route (and the price table's globs), acknowledged. Afterwards every added or
removed lease is pushed and acknowledged, which is how a mint or revoke returns only once the
data plane has it (SPEC §3); so is every change of the leases' budget gates (SPEC §18) and of
the accounts an operator disabled (SPEC §20: their sockets close).
Attempt reports flow the other way and are handed to `on_message`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from shared.logging import get_logger
from shared.rpc import Connection, FrameError, Handler, peer_uid
from shared.wire import (
    PROTOCOL_VERSION,
    AccountRoute,
    AccountsDisabled,
    Drain,
    Hello,
    Lease,
    LeaseAdded,
    LeaseGate,
    LeaseGates,
    LeaseRemoved,
    Message,
    Refused,
    Snapshot,
    StorageState,
    Welcome,
)

log = get_logger("replication")

HANDSHAKE_TIMEOUT_S = 5.0
# A data plane that does not acknowledge a push within this is treated as gone: the link is
# closed, the data plane drops every lease and resynchronises from a fresh snapshot.
ACK_TIMEOUT_S = 5.0


class DataPlaneLink:
    def __init__(self) -> None:
        self._snapshot: Callable[[], tuple[list[Lease], list[AccountRoute], bool]] = lambda: ([], [], True)
        self._on_message: Handler | None = None
        self._on_disconnect: Callable[[], None] = lambda: None
        self._read_done: Callable[[], None] | None = None
        self.conn: Connection | None = None
        self.peer_pid: int | None = None
        self.ready = asyncio.Event()
        self.priced: list[str] | None = None  # the price table's globs, sent with each snapshot
        # SPEC §9, §20: the accounts an operator disabled, as the data plane was (or will be,
        # by the next snapshot) told; `accounts_disabled` changes it.
        self.disabled: tuple[str, ...] = ()

    def bind(
        self,
        snapshot: Callable[[], tuple[list[Lease], list[AccountRoute], bool]],
        on_message: Handler,
        on_disconnect: Callable[[], None],
        read_done: Callable[[], None] | None = None,
    ) -> None:
        """What the link serves from: the service that owns the leases and takes the rows (and
        settles each read's, `read_done`)."""
        self._snapshot = snapshot
        self._on_message = on_message
        self._on_disconnect = on_disconnect
        self._read_done = read_done

    @property
    def connected(self) -> bool:
        return self.conn is not None and not self.conn.closed.is_set()

    async def on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(reader, writer, "dataplane")
        uid = peer_uid(writer)
        if uid != os.getuid():
            log.warning("rpc_peer_refused", reason="peer-uid-mismatch", peer_uid=uid)
            conn.close()
            return
        try:
            hello = await asyncio.wait_for(conn.read_message(), HANDSHAKE_TIMEOUT_S)
        except (TimeoutError, FrameError, asyncio.IncompleteReadError, ConnectionError) as exc:
            log.warning("rpc_handshake_failed", reason=getattr(exc, "reason", type(exc).__name__))
            conn.close()
            return
        refusal = self._refusal(hello)
        if refusal is not None:
            log.warning("rpc_peer_refused", reason=refusal)
            try:
                await conn.send(Refused(reason=refusal))
            finally:
                conn.close()
            return
        await conn.send(Welcome(version=PROTOCOL_VERSION))
        self.conn = conn
        self.peer_pid = hello.pid  # type: ignore[union-attr]
        assert self._on_message is not None, "bind() the link before serving"
        runner = asyncio.ensure_future(conn.run(self._on_message, self._read_done))
        try:
            leases, routes, storage_ok = self._snapshot()
            await conn.request(
                lambda rid: Snapshot(
                    req_id=rid,
                    leases=leases,
                    accounts=routes,
                    storage_ok=storage_ok,
                    priced=self.priced,
                    disabled=list(self.disabled) or None,
                ),
                ACK_TIMEOUT_S,
            )
            self.ready.set()
            log.info("dataplane_synchronised", leases=len(leases), pid=hello.pid)  # type: ignore[union-attr]
            await runner
        except (TimeoutError, ConnectionError) as exc:
            log.warning("dataplane_sync_failed", reason=type(exc).__name__)
        finally:
            conn.close()
            runner.cancel()
            if self.conn is conn:
                self.conn = None
                self.peer_pid = None
                self.ready.clear()
                self._on_disconnect()
                log.warning("dataplane_disconnected")

    def _refusal(self, hello: Message) -> str | None:
        if not isinstance(hello, Hello):
            return "expected-hello"
        if hello.version != PROTOCOL_VERSION:
            return f"protocol-version-mismatch: control {PROTOCOL_VERSION}, dataplane {hello.version}"
        if self.connected:
            return "another-dataplane-connected"
        return None

    async def _push(self, build: Callable[[int], Message]) -> bool:
        """Push and wait for the ack; True if the data plane has it, False if it is gone."""
        conn = self.conn  # set before the snapshot is built, so no push can fall between them
        if conn is None:
            return False
        try:
            await conn.request(build, ACK_TIMEOUT_S)
            return True
        except TimeoutError:
            log.error("dataplane_ack_timeout", action="closing link; dataplane will resync")
            conn.close()
        except ConnectionError:
            pass
        return False

    async def lease_added(self, lease: Lease) -> bool:
        return await self._push(lambda rid: LeaseAdded(req_id=rid, lease=lease))

    async def leases_removed(self, key_ids: list[str]) -> bool:
        return await self._push(lambda rid: LeaseRemoved(req_id=rid, key_ids=key_ids))

    async def gates_changed(self, gates: list[LeaseGate]) -> bool:
        return await self._push(lambda rid: LeaseGates(req_id=rid, gates=gates))

    async def accounts_disabled(self, account_ids: tuple[str, ...]) -> bool:
        """The disabled accounts changed (SPEC §20): pushed and acknowledged, and sent with every
        later snapshot; True once the data plane has them, False when none is linked (its next
        snapshot carries them)."""
        self.disabled = account_ids
        return await self._push(lambda rid: AccountsDisabled(req_id=rid, account_ids=list(account_ids)))

    async def drain(self, timeout_s: float) -> bool:
        """Ask the data plane for every report it holds back, ahead of its Ack (`Drain`); True
        once the Ack is in, so is every row before it (the reader handled them in order). A slow
        answer is a TimeoutError for the caller and does not close the link: a read must not
        cost the data plane its leases."""
        conn = self.conn
        if conn is None:
            return False
        try:
            await conn.request(lambda rid: Drain(req_id=rid), timeout_s)
        except ConnectionError:
            return False
        return True

    def storage_state(self, ok: bool) -> None:
        conn = self.conn
        if conn is not None:
            try:
                conn.send_nowait(StorageState(ok=ok))
            except ConnectionError:
                pass
