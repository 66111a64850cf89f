"""`PolicyStore`: the routing policy, which *is* its hash chain (SPEC §10).

`$GATEWAY_STATE_DIR/policy.jsonl` holds one record per write, anchored by `policy-head.json`;
each record carries one level's whole document, which replaces that level's previous one. The
revision is the record count. There is no snapshot: every level's current document is
`fold_records` of the verified chain.

Reads (`resolve`, `is_unavailable`) are cheap on the event loop while the chain is unchanged (a
stat, the anchor and an O(1) tail read), one verified re-fold when it changed. A chain that
cannot be believed — `corrupt`, or a verified record whose document no longer decodes — holds
every v2 mint `policy-unavailable` and refuses every write.

Writes run in a worker thread (`asyncio.to_thread`): the file lock's poll is a blocking sleep,
then the chain is re-read, re-hashed and fsynced. A write decides from the file under the lock
(not the cache): revision check (409 naming the current revision), then the tenancy check
against the documents actually on file, then one append.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from controlplane.core.policy import (
    Ceiling,
    PolicyState,
    ResolvedPolicy,
    Tenancy,
    fold_policy,
    fold_records,
    layers_for,
    tenancy_conflicts,
    tenancy_of,
)
from controlplane.core.policydocs import Finding, Level, LevelDocument, Problem, check_document, parse_level
from shared.chain import ChainCheck, Verdict
from shared.chainfile import ChainCorrupt, ChainView, HashChain
from shared.chainstorage import ChainBusy, ChainError, ChainStorage, RevisionConflict
from shared.clock import iso_ms, now_ms
from shared.codes import ErrorCode, Refusal
from shared.errors import GatewayError
from shared.logging import get_logger

log = get_logger("policy")

CHAIN_FILE = "policy.jsonl"
ANCHOR_FILE = "policy-head.json"
# One record must stay far below the chain's 64 KiB tail read.
MAX_DOCUMENT_BYTES = 32 * 1024
# Resolved policies kept per chain view (a (repo, role) each; all forgotten when the view changes)
RESOLVED_CAP = 4_096

_encode = msgspec.json.Encoder().encode


class PolicyWrite(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    document: dict[str, Any]
    record: dict[str, Any]
    revision: int  # the revision after this write
    based_on_revision: int


class Resolution(msgspec.Struct, frozen=True, kw_only=True):
    """What explain shows: the resolved policy, the tenancy and the levels present."""

    policy: ResolvedPolicy
    tenancy: Tenancy
    present: tuple[str, ...]


class PolicyUnavailable(Exception):
    pass


def refusal_of_findings(name: str, findings: Iterable[Finding]) -> GatewayError:
    problems = [
        {
            "field": f.field,
            "problem": str(f.problem),
            "names": list(f.names),
            **({"detail": f.detail} if f.detail else {}),
        }
        for f in findings
    ]
    text = "; ".join(
        f"{p['field']}: {p['problem']}"
        + (f" {', '.join(p['names'])}" if p["names"] else "")
        + (f" ({p['detail']})" if "detail" in p else "")
        for p in problems
    )
    return GatewayError(
        ErrorCode.INVALID_REQUEST, f"policy level {name!r} refused: {text}", extra={"name": name, "problems": problems}
    )


class PolicyStore:
    def __init__(
        self,
        state_dir: str,
        account_ids: Iterable[str],
        ceiling: Ceiling,
        *,
        clock: Callable[[], int] = now_ms,
        storage: ChainStorage | None = None,
        recent_s: float | None = None,
    ) -> None:
        """`storage`: where the chain's bytes live (the state dir's files by default; fleet
        mode: Redis, mirrored into those files). `recent_s`: see `HashChain.read_recent`."""
        self.known_accounts = frozenset(account_ids)
        self.ceiling = ceiling
        self._clock = clock
        self.chain: HashChain[PolicyState] = HashChain(
            os.path.join(state_dir, CHAIN_FILE),
            os.path.join(state_dir, ANCHOR_FILE),
            fold_records,
            storage=storage,
            recent_s=recent_s,
        )
        self.write_listeners: list[Callable[[PolicyWrite], None]] = []  # after each append (budgets)
        self._resolved: tuple[ChainView[PolicyState] | None, dict[tuple[str, str | None], ResolvedPolicy]] = (None, {})

    # ---- reads (the mint's `PolicySource`) --------------------------------------------------

    def read(self) -> ChainView[PolicyState]:
        """Safe on the event loop (`HashChain.read_recent`)."""
        return self.chain.read_recent()

    async def read_async(self) -> ChainView[PolicyState]:
        return await asyncio.to_thread(self.chain.read)

    async def refresh(self) -> None:
        """Validate the chain off the loop now when its storage is remote (see the admin store's)."""
        if self.chain.recent_s is not None:
            await self.chain.refresh()  # fleet: unchanged, one async round trip and no thread

    @staticmethod
    def believable(view: ChainView[PolicyState]) -> bool:
        return view.state is not None and not view.state.unreadable

    def is_unavailable(self) -> bool:
        return not self.believable(self.read())

    def resolve(self, repo_slug: str, worker_role: str | None) -> ResolvedPolicy:
        """The fold for (repo, role), kept while the chain's view is the same object (an
        unchanged chain keeps its view: `HashChain.refresh`), so a mint folds once per chain
        change instead of once or twice per mint (fleet: before and after the refresh; issue 27).
        The fold is pure over the view's state and revision, and the ceiling, fixed at start."""
        view = self.read()
        seen, resolved = self._resolved
        if seen is not view:
            resolved = {}
            self._resolved = (view, resolved)
        policy = resolved.get((repo_slug, worker_role))
        if policy is None:
            policy = self.resolution(repo_slug, worker_role, view).policy
            if len(resolved) < RESOLVED_CAP:
                resolved[(repo_slug, worker_role)] = policy
        return policy

    def resolution(
        self, repo_slug: str, worker_role: str | None, view: ChainView[PolicyState] | None = None
    ) -> Resolution:
        view = view if view is not None else self.read()
        if not self.believable(view):
            raise GatewayError(
                Refusal.POLICY_UNAVAILABLE,
                "the policy chain cannot be believed",
                extra={"chain_verdict": str(view.check.verdict)},
            )
        state = view.state
        assert state is not None
        layers = layers_for(state, repo_slug, worker_role)
        return Resolution(
            policy=fold_policy(layers, self.ceiling, revision=len(view.check.records)),
            tenancy=tenancy_of(state, repo_slug, worker_role),
            present=tuple(layer.label for layer in layers),
        )

    # ---- the one write ----------------------------------------------------------------------

    def validate(self, name: str, raw: Any) -> tuple[Level, LevelDocument]:
        """The level and its checked document, or a 422 naming every problem."""
        level = parse_level(name)
        if level is None:
            raise refusal_of_findings(
                name,
                [
                    Finding(
                        field="name",
                        problem=Problem.INVALID_LEVEL,
                        names=(name,),
                        detail="platform, org:<id>, team:<id>, repo:<slug> or binding:<slug>#<role>",
                    )
                ],
            )
        checked = check_document(level, raw, self.known_accounts)
        if checked.document is None:
            raise refusal_of_findings(name, checked.findings)
        if len(_encode(checked.document)) > MAX_DOCUMENT_BYTES:
            raise GatewayError(
                ErrorCode.INVALID_REQUEST, f"the document is larger than {MAX_DOCUMENT_BYTES} bytes", status=413
            )
        return level, checked.document

    async def put_level(
        self, name: str, raw: Any, *, expected_revision: int, reason: str, actor: str | None, authenticated_by: str
    ) -> PolicyWrite:
        level, document = self.validate(name, raw)
        plain = msgspec.json.decode(_encode(document))

        def build(check: ChainCheck) -> dict[str, Any]:
            state = fold_records(check.records)
            if state.unreadable:
                raise PolicyUnavailable(f"records {list(state.unreadable)} do not decode")
            conflicts = tenancy_conflicts(state, level, document)
            if conflicts:
                raise refusal_of_findings(level.label, conflicts)
            return {
                "at": iso_ms(self._clock()),
                "actor": actor,
                "actor_authenticated_by": authenticated_by,
                "name": level.label,
                "document": plain,
                "reason": reason,
            }

        try:
            committed = await asyncio.to_thread(self.chain.commit, build, expected_revision)
        except ChainError as exc:
            raise refusal_of(exc) from None
        except PolicyUnavailable as exc:
            log.error("policy_unreadable", error=str(exc))
            raise GatewayError(
                Refusal.POLICY_UNAVAILABLE,
                "the policy chain holds a record that does "
                "not decode; no write is accepted until an operator restores it",
            ) from None
        log.info(
            "policy_level_written",
            name=level.label,
            revision=committed.revision,
            actor=actor,
            authenticated_by=authenticated_by,
        )
        written = PolicyWrite(
            name=level.label,
            document=plain,
            record=committed.record,
            revision=committed.revision,
            based_on_revision=committed.based_on_revision,
        )
        for listener in self.write_listeners:
            try:
                listener(written)
            except Exception:  # a listener's bug must not turn a committed write into an error
                log.exception("policy_listener_failed", name=level.label)
        return written


def refusal_of(exc: ChainError) -> GatewayError:
    """How a policy write that did not append answers over HTTP."""
    if isinstance(exc, RevisionConflict):
        return GatewayError(
            ErrorCode.REVISION_CONFLICT,
            f"expected_revision is {exc.expected} but the policy chain is at revision {exc.current}; "
            "read it again and retry",
            status=409,
            extra={"current_revision": exc.current, "expected_revision": exc.expected},
        )
    if isinstance(exc, ChainCorrupt):
        return GatewayError(
            Refusal.POLICY_UNAVAILABLE,
            f"the policy chain is corrupt ({exc.check.fault}); no write is accepted until an operator restores it",
            extra={"chain_verdict": str(Verdict.CORRUPT), "chain_reason": str(exc.check.fault)},
        )
    if isinstance(exc, ChainBusy):
        return GatewayError(Refusal.POLICY_UNAVAILABLE, "another policy write holds the chain; retry", retry_after_s=1)
    log.error("policy_unwritable", error=str(exc))
    return GatewayError(
        Refusal.POLICY_UNAVAILABLE, "the policy chain could not be written; nothing was recorded", retry_after_s=5
    )
