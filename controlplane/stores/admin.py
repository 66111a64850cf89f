"""`AccountAdminStore`: the administrative overlay, which *is* its audit chain (SPEC §9).

`$GATEWAY_STATE_DIR/account-admin.jsonl` holds one record per operator action, anchored by
`account-admin-head.json`. There is no snapshot file: the overlay is `fold_overlay` of the
verified chain and the revision is its record count, so no state change exists without its
audit record, nor a record without its change.

Reads (`read`, `is_unavailable`, `state_of`, `overlay`) are cheap and safe on the event loop: a
stat, an anchor read and an O(1) tail read while the chain is unchanged, one verified re-fold
when it has changed. The store is the mint's `controlplane.overlays.AdminOverlay`: a `corrupt`
chain is `is_unavailable()` (the mint holds, `account-state-unavailable`), has no overlay, and
refuses every mutation here.

Mutations run in a worker thread (`asyncio.to_thread`): the lock poll is a blocking sleep, then
the chain is re-read, re-hashed and fsynced, and none of that may stall the streams the loop is
proxying. `revoke-leases` has a side effect that must sit *inside* the mutation, after the
revision check and before the append (revoking first would let a stale request destroy leases
and then be told 409; appending first would record a revocation that had not happened). The
revocation is a coroutine of the control service, so it must run on the loop, yet the file lock
must be held from the revision check to the append. The mutation therefore stays in ONE worker
thread from lock to release, and that thread lends the revocation to the loop
(`run_coroutine_threadsafe`) and waits for it, still holding the lock. The lock never crosses a
thread (filelock's per-thread state stays coherent), no second writer can commit in between,
and the loop is never blocked: it is merely awaiting the thread. A revoker must not itself
mutate this store (it would wait for the lock it is running under).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import msgspec

from controlplane.core.overlay import AdminAction, Overlay, fold_overlay
from shared.capacity import StateUnavailable
from shared.chain import ChainCheck, Verdict
from shared.chainfile import ChainCorrupt, ChainUnwritable, ChainView, Committed, HashChain
from shared.chainstorage import ChainBusy, ChainError, ChainStorage, RevisionConflict
from shared.clock import iso_ms, now_ms
from shared.codes import AdminState, ErrorCode, Refusal
from shared.errors import GatewayError
from shared.logging import get_logger

log = get_logger("admin")

CHAIN_FILE = "account-admin.jsonl"
ANCHOR_FILE = "account-admin-head.json"
# How long a revoke-leases mutation waits, holding the writer's lock, for the revocation.
REVOCATION_TIMEOUT_S = 60.0


class Revocation(msgspec.Struct, frozen=True, kw_only=True):
    """What an account-wide revocation did: the leases it ended (on every host that answered),
    and the live hosts that did not acknowledge it within the bound (fleet mode, SPEC §16)."""

    revoked: int
    unacknowledged_hosts: tuple[str, ...] = ()


Revoker = Callable[[str], Coroutine[Any, Any, int | Revocation]]


class AdminMutation(msgspec.Struct, frozen=True, kw_only=True):
    record: dict[str, Any]
    revision: int  # the revision after this record
    based_on_revision: int  # the revision the mutation was decided against
    expected_revision: int | None  # what the caller supplied (None: applied at the current one)
    revoked: int | None = None  # leases ended by a revoke-leases mutation
    unacknowledged_hosts: tuple[str, ...] | None = None  # of a revoke-leases: live hosts that did not ack


class RevocationFailed(Exception):
    """The revocation raised or timed out: nothing was appended."""


class AccountAdminStore:
    def __init__(
        self,
        state_dir: str,
        account_ids: Sequence[str],
        *,
        clock: Callable[[], int] = now_ms,
        on_commit: Callable[[dict[str, Any]], object] | None = None,
        storage: ChainStorage | None = None,
        recent_s: float | None = None,
    ) -> None:
        """`storage`: where the chain's bytes live (the state dir's files by default; fleet
        mode: Redis, mirrored into those files). `recent_s`: see `HashChain.read_recent`."""
        self.account_ids = tuple(account_ids)
        self._known = frozenset(self.account_ids)
        self._clock = clock
        self._on_commit = on_commit
        # Awaited after a committed set-state, before it answers (SPEC §20: the data plane hears
        # a disable before the PATCH returns, `controlplane/disabled.py`); wired after the link.
        self.settle: Callable[[], Awaitable[object]] | None = None
        self.chain: HashChain[Overlay] = HashChain(
            os.path.join(state_dir, CHAIN_FILE),
            os.path.join(state_dir, ANCHOR_FILE),
            fold_overlay,
            storage=storage,
            recent_s=recent_s,
        )

    # ---- reads ----------------------------------------------------------------------------

    def read(self) -> ChainView[Overlay]:
        """One read: check and overlay from the same bytes (a revision never labels another
        read's overlay). Safe on the event loop (`HashChain.read_recent`)."""
        return self.chain.read_recent()

    async def read_async(self) -> ChainView[Overlay]:
        return await asyncio.to_thread(self.chain.read)

    async def refresh(self) -> None:
        """Validate the chain off the loop now, when its storage is remote (a mint calls this
        first, so it decides on the chain as it is); a no-op over the local files."""
        if self.chain.recent_s is not None:
            await self.chain.refresh()  # fleet: unchanged, one async round trip and no thread

    def verdict(self) -> Verdict:
        return self.read().check.verdict

    def is_unavailable(self) -> bool:
        """The chain cannot be believed: hold every v2 mint (`account-state-unavailable`)."""
        return self.read().check.verdict is Verdict.CORRUPT

    def overlay(self) -> Overlay | None:
        """The overlay, or None when the chain is corrupt."""
        return self.read().state

    def state_of(self, account_id: str) -> AdminState:
        """An account's state; `disabled` while the chain is corrupt (callers that must tell the
        two apart ask `is_unavailable()` or `overlay()` first: the mint holds before selecting)."""
        overlay = self.overlay()
        return AdminState.DISABLED if overlay is None else overlay.state_of(account_id)

    def is_known(self, account_id: str) -> bool:
        return account_id in self._known

    # ---- mutations ------------------------------------------------------------------------

    async def set_state(
        self,
        account_id: str,
        state: AdminState,
        *,
        reason: str,
        actor: str | None,
        authenticated_by: str,
        expected_revision: int | None = None,
    ) -> AdminMutation:
        self._require_known(account_id)

        def build(_check: ChainCheck) -> dict[str, Any]:
            return self._fields(account_id, AdminAction.SET_STATE, AdminState(state), reason, actor, authenticated_by)

        committed = await self._commit(build, expected_revision)
        log.info(
            "account_state_set",
            account_id=account_id,
            state=str(state),
            revision=committed.revision,
            actor=actor,
            authenticated_by=authenticated_by,
        )
        done = self._done(committed, expected_revision)
        if self.settle is not None:
            try:
                await self.settle()
            except Exception:  # the commit stands; the next tick or snapshot tells the data plane
                log.exception("admin_commit_settle_failed")
        return done

    async def revoke_leases(
        self,
        account_id: str,
        revoke: Revoker,
        *,
        reason: str,
        actor: str | None,
        authenticated_by: str,
        expected_revision: int | None = None,
    ) -> AdminMutation:
        self._require_known(account_id)
        loop = asyncio.get_running_loop()
        revoked: list[Revocation] = []

        def build(_check: ChainCheck) -> dict[str, Any]:
            # In the mutation's thread, lock held, revision already checked: lend the revocation
            # to the loop and wait for it before anything is appended.
            future = asyncio.run_coroutine_threadsafe(revoke(account_id), loop)
            try:
                done = future.result(timeout=REVOCATION_TIMEOUT_S)
                revoked.append(done if isinstance(done, Revocation) else Revocation(revoked=int(done)))
            except concurrent.futures.TimeoutError:
                future.cancel()
                raise RevocationFailed(f"no answer within {REVOCATION_TIMEOUT_S:g}s") from None
            except StateUnavailable:  # fleet mode: nothing appended; held 503 fleet-state-unavailable
                raise
            except Exception as exc:
                raise RevocationFailed(repr(exc)) from exc
            return self._fields(account_id, AdminAction.REVOKE_LEASES, None, reason, actor, authenticated_by)

        committed = await self._commit(build, expected_revision)
        log.info(
            "account_leases_revoked",
            account_id=account_id,
            revoked=revoked[0].revoked,
            unacknowledged_hosts=list(revoked[0].unacknowledged_hosts),
            revision=committed.revision,
            actor=actor,
            authenticated_by=authenticated_by,
        )
        return self._done(committed, expected_revision, revoked[0])

    # ---- internals ------------------------------------------------------------------------

    def _require_known(self, account_id: str) -> None:
        if account_id not in self._known:
            raise GatewayError(
                ErrorCode.NOT_FOUND, f"no account {account_id!r} in the registry", extra={"account_id": account_id}
            )

    def _fields(
        self,
        account_id: str,
        action: AdminAction,
        state: AdminState | None,
        reason: str,
        actor: str | None,
        authenticated_by: str,
    ) -> dict[str, Any]:
        return {
            "at": iso_ms(self._clock()),
            "actor": actor,
            "actor_authenticated_by": authenticated_by,
            "account_id": account_id,
            "action": str(action),
            "state": None if state is None else str(state),
            "reason": reason,
        }

    async def _commit(self, build: Callable[[ChainCheck], dict[str, Any]], expected_revision: int | None) -> Committed:
        try:
            return await asyncio.to_thread(self.chain.commit, build, expected_revision)
        except ChainError as exc:
            raise refusal_of(exc) from None
        except RevocationFailed as exc:
            log.error("account_revocation_failed", error=str(exc))
            raise GatewayError(
                Refusal.INTERNAL_ERROR,
                "the lease revocation failed, so nothing was recorded; some leases "
                "may already be revoked; retry the request",
            ) from None

    def _done(
        self, committed: Committed, expected_revision: int | None, revoked: Revocation | None = None
    ) -> AdminMutation:
        if self._on_commit is not None:
            try:
                self._on_commit(committed.record)
            except Exception:  # a listener never unmakes a committed mutation
                log.exception("admin_commit_listener_failed")
        return AdminMutation(
            record=committed.record,
            revision=committed.revision,
            based_on_revision=committed.based_on_revision,
            expected_revision=expected_revision,
            revoked=None if revoked is None else revoked.revoked,
            unacknowledged_hosts=None if revoked is None else revoked.unacknowledged_hosts,
        )


def refusal_of(exc: ChainError) -> GatewayError:
    """How a chain that did not append answers over HTTP."""
    if isinstance(exc, RevisionConflict):
        return GatewayError(
            ErrorCode.REVISION_CONFLICT,
            f"expected_revision is {exc.expected} but the account-admin chain is at revision "
            f"{exc.current}; read it again and retry",
            status=409,
            extra={"current_revision": exc.current, "expected_revision": exc.expected},
        )
    if isinstance(exc, ChainCorrupt):
        return GatewayError(
            Refusal.ACCOUNT_STATE_UNAVAILABLE,
            f"the account-admin chain is corrupt ({exc.check.fault}); no mutation is accepted "
            "until an operator restores it",
            extra={"chain_verdict": str(Verdict.CORRUPT), "chain_reason": str(exc.check.fault)},
        )
    if isinstance(exc, ChainBusy):
        return GatewayError(
            Refusal.ACCOUNT_STATE_UNAVAILABLE, "another administrative mutation holds the chain; retry", retry_after_s=1
        )
    assert isinstance(exc, ChainUnwritable)
    log.error("account_admin_unwritable", error=str(exc))
    return GatewayError(
        Refusal.ACCOUNT_STATE_UNAVAILABLE,
        "the account-admin chain could not be written; nothing was recorded",
        retry_after_s=5,
    )
