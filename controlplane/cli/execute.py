"""`leaseholdctl exec -- CMD...` (SPEC §13): run a worker on a lease, then revoke it.

Reading order: mint a v2 lease, a dispatch key unless `--fallback-driver caller` (held → exit 3,
nothing runs) → look up the account's wire → build the worker's environment → (a dispatch key)
start the extender and, with `-v`, the hop watcher (`supervise.py`) → run CMD, forwarding
SIGINT/SIGTERM/SIGHUP → revoke the lease (always, also when anything above fails) → return
CMD's status (128 + N after signal N).

The worker's environment is `scrub_spawn_env(os.environ)` (the whole `GATEWAY_*` namespace
gone), minus this CLI's own `LEASEHOLD_TOKEN` and every provider credential variable, plus the
base URL and virtual key of the lease's wire, and a W3C `TRACEPARENT` (SPEC §21: the caller's
own when valid, else a new trace). A worker holds its lease and nothing else.

The child runs in its own process group, so a signal reaches it exactly once: forwarded by us,
or — when we own the terminal — from the terminal itself, which we hand to the child's group
(the job-control dance a shell does) and take back when it exits.

Signal dispositions are passed through, as if CMD had been started directly: CMD starts with
each forwarded signal ignored if this process was started with it ignored (nohup's SIGHUP, the
SIGINT of a shell's background job) and at its default otherwise (`worker_dispositions`). The
forwarding handlers are installed before CMD is spawned, so no signal falls between the two.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from controlplane.cli.client import Client
from controlplane.cli.exits import CtlError, Exit
from controlplane.cli.keys import V2_PATH, v2_body, v2_exit
from controlplane.cli.output import skipped_text, warn
from controlplane.cli.supervise import Extender, HopWatcher
from shared.bounds import TTL_MAX_S, TTL_MIN_S
from shared.codes import WIRE_OF_BINDING, Binding, Scope, Wire
from shared.envscrub import scrub_spawn_env
from shared.tokens import new_ulid
from shared.tracecontext import worker_traceparent
from shared.wires import FACTS

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Never inherited by a worker: this CLI's bearer token and any real provider credential (a
# stray one would be sent instead of, or beside, the lease: Claude Code sends both headers).
WITHHELD = ("LEASEHOLD_TOKEN", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "OPENAI_API_KEY", "CODEX_API_KEY")
NOT_FOUND_STATUS, NOT_EXECUTABLE_STATUS = 127, 126
SIGNALS_HELP = """\
signals:
  SIGINT, SIGTERM and SIGHUP sent to leaseholdctl are forwarded to CMD's process group, once;
  in a terminal, CMD owns it while it runs, so Ctrl-C reaches CMD directly. CMD starts with
  the signal dispositions leaseholdctl was started with, as if it had been run directly: a
  signal leaseholdctl was started with ignored (SIGHUP under nohup, SIGINT in a shell's
  background job `&`) is ignored by CMD too, so forwarding it does nothing unless CMD
  handles it itself; every other forwarded signal starts at its default. To stop such a run,
  send SIGTERM. Whatever ends CMD, the lease is revoked and leaseholdctl returns CMD's
  status (128+N when signal N ended it).
"""


def worker_env(env: Mapping[str, str], wire: Wire, base_url: str, token: str) -> dict[str, str]:
    clean = {k: v for k, v in scrub_spawn_env(env).items() if k not in WITHHELD}
    url_var, key_var = FACTS[wire].worker_env
    clean[url_var] = base_url
    clean[key_var] = token
    # SPEC §21: the worker's requests join one trace (the caller's, if it was started in one)
    clean["TRACEPARENT"] = worker_traceparent(env)
    return clean


def for_codex(command: list[str], wire: Wire, env: dict[str, str]) -> list[str]:
    """CMD as run. Codex reads neither `OPENAI_BASE_URL` nor (in `exec`) `OPENAI_API_KEY`: its
    built-in OpenAI provider is pointed at the gateway on its command line (`-c
    openai_base_url=...`) and given the key as `CODEX_API_KEY`, so it opens the Responses
    WebSocket first, its fastest path (SPEC §20), and falls back to HTTP by itself."""
    facts = FACTS[wire]
    if not facts.codex or os.path.basename(command[0]) != "codex":
        return list(command)
    url_var, key_var = facts.worker_env
    env["CODEX_API_KEY"] = env[key_var]
    return [command[0], "-c", f'openai_base_url="{env[url_var]}"', *command[1:]]


def exit_status(returncode: int) -> int:
    """A shell's convention: a child ended by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def wire_of(accounts_view: dict[str, Any], account_id: str) -> Wire:
    for account in accounts_view.get("accounts", []):
        if account.get("id") == account_id:
            return WIRE_OF_BINDING[Binding(account["provider_binding"])]
    raise CtlError(Exit.FAILED, f"account {account_id} is not in the accounts view")


# ---- the child ------------------------------------------------------------------------------


def _own_terminal() -> int | None:
    """The tty fd on stdin when we are its foreground process group, else None."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return 0
    except OSError:
        pass
    return None


def _give_terminal(fd: int, pgid: int) -> None:
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(fd, pgid)
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, previous)


def worker_dispositions(inherited: Mapping[int, Any]) -> dict[int, Any]:
    """What CMD starts with for each forwarded signal: ignored if we were started with it
    ignored, else its default (whatever handler this process had is not CMD's business)."""
    return {sig: signal.SIG_IGN if handler == signal.SIG_IGN else signal.SIG_DFL for sig, handler in inherited.items()}


def run_child(argv: list[str], env: dict[str, str]) -> int:
    tty = _own_terminal()
    dispositions = worker_dispositions({sig: signal.getsignal(sig) for sig in FORWARDED})
    child: subprocess.Popen | None = None
    early: list[int] = []  # signals that arrived before the child existed

    def forward(signum: int, _frame: Any) -> None:
        if child is None:
            early.append(signum)
            return
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    def prepare() -> None:  # runs in the child before exec: no race with its first read
        for sig, disposition in dispositions.items():
            signal.signal(sig, disposition)
        if tty is not None:
            _give_terminal(tty, os.getpid())

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        try:
            child = subprocess.Popen(argv, env=env, process_group=0, preexec_fn=prepare)
        except FileNotFoundError:
            warn(f"cannot run {argv[0]}: command not found")
            return NOT_FOUND_STATUS
        except PermissionError:
            warn(f"cannot run {argv[0]}: permission denied")
            return NOT_EXECUTABLE_STATUS
        for signum in early:
            forward(signum, None)
        return exit_status(child.wait())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if tty is not None:
            _give_terminal(tty, os.getpgrp())


# ---- the command ----------------------------------------------------------------------------


def _mint(args: argparse.Namespace, client: Client) -> dict[str, Any]:
    dispatch = args.dispatch or "exec-" + new_ulid()
    body = v2_body(
        dispatch,
        args.repo,
        args.principal_kind,
        args.principal,
        role=args.role,
        model=args.model,
        model_class=args.model_class,
        ttl=args.ttl,
    )
    body["fallback_driver"] = args.fallback_driver
    reply = client.call("POST", V2_PATH, body)
    code = v2_exit(reply)
    if code == Exit.HELD:
        raise CtlError(
            Exit.HELD,
            f"mint held: {reply.body.get('refusal_reason')} "
            f"(Retry-After: {reply.headers.get('retry-after', '?')}s; "
            f"skipped {skipped_text(reply.body.get('skipped'))}); CMD was not started",
        )
    if code == Exit.REJECTED:
        raise CtlError(Exit.REJECTED, f"mint rejected: {reply.body.get('refusal_reason')}; CMD was not started")
    return client.expect(reply, Scope.MINT, V2_PATH)


def _revoke(client: Client, key_id: str) -> None:
    path = f"/control/v1/keys/{key_id}"
    try:
        client.expect(client.call("DELETE", path), Scope.MINT, path)
    except CtlError as exc:
        warn(f"could not revoke lease {key_id}; it stays live until it expires: {exc.message}")


def run_exec(args: argparse.Namespace, client: Client) -> int:
    command = args.command
    if not command:
        raise CtlError(Exit.USAGE, "exec needs a command after --, e.g. leaseholdctl exec ... -- claude -p hi")
    if (args.model is None) == (args.model_class is None):
        raise CtlError(Exit.USAGE, "exec needs exactly one of --model or --model-class")
    minted = _mint(args, client)
    key_id = minted["key_id"]
    helpers: list[Extender | HopWatcher] = []
    try:
        wire = wire_of(client.get("/control/v2/accounts", Scope.READ), minted["account_id"])
        env = worker_env(os.environ, wire, minted["base_url"], minted["token"])
        if args.verbose:
            warn(
                f"lease {key_id} on {minted['account_id']} ({wire} wire, decision "
                f"{minted.get('mint_decision_id')}, fallback driven by the {args.fallback_driver}); "
                f"trace {env['TRACEPARENT'].split('-')[1]}; running {command[0]}"
            )
        if minted.get("fallback_driver") == "gateway":
            helpers.append(Extender(client, key_id, _ttl_s(minted, args.ttl)))
            if args.verbose:
                helpers.append(HopWatcher(client, key_id, sockets=FACTS[wire].websocket_path is not None))
        for helper in helpers:
            helper.start()
        sys.stdout.flush()
        return run_child(for_codex(command, wire, env), env)
    finally:
        for helper in helpers:
            helper.stop()
        _revoke(client, key_id)


def _ttl_s(minted: dict[str, Any], ttl: int | None) -> int:
    """The TTL each extension asks for: the one asked at the mint, else what the mint gave."""
    if ttl is not None:
        return ttl
    expires = datetime.fromisoformat(minted["expires_at"].replace("Z", "+00:00"))
    return max(TTL_MIN_S, min(TTL_MAX_S, round((expires - datetime.now(UTC)).total_seconds())))


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "exec",
        help="run a command on a fresh lease, then revoke it",
        description="Mint a v2 lease, run CMD with a scrubbed environment (no GATEWAY_*) "
        "plus ANTHROPIC_BASE_URL/ANTHROPIC_API_KEY or OPENAI_BASE_URL/"
        "OPENAI_API_KEY, forward SIGINT/SIGTERM/SIGHUP, revoke the lease when "
        "CMD exits and return CMD's exit status.",
        epilog=SIGNALS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    del common  # exec prints its command's output, not a control answer: no --json
    p.add_argument(
        "--token-file",
        metavar="PATH",
        help="a file holding the bearer token (else LEASEHOLD_TOKEN, GATEWAY_CONTROL_TOKEN, GATEWAY_MINT_TOKEN)",
    )
    p.add_argument("--token", help=argparse.SUPPRESS)  # refused by main (SPEC §19)
    p.add_argument("--repo", required=True, help="repo_slug")
    p.add_argument("--principal", required=True, help="principal_id")
    p.add_argument("--principal-kind", default="worker", help="principal_kind (default worker)")
    p.add_argument("--role", help="worker_role")
    model = p.add_mutually_exclusive_group()
    model.add_argument("--model", help="model")
    model.add_argument("--model-class", help="model_class")
    p.add_argument("--dispatch", help="dispatch_id (default: a fresh exec-<ULID>)")
    p.add_argument("--ttl", type=int, help="ttl_seconds of the lease")
    p.add_argument(
        "--fallback-driver",
        choices=("gateway", "caller"),
        default="gateway",
        help="gateway (default): a dispatch key the gateway hops to a sibling account on "
        "its own evidence and extends while CMD runs (SPEC §17); caller: a plain v2 "
        "lease that never moves",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="say which lease the command runs on, and print each hop as it happens",
    )
    p.add_argument("command", nargs="*", metavar="-- CMD", help="the command and its arguments")
    p.set_defaults(run=run_exec)
