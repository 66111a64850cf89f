"""`leaseholdctl`: the operator / orchestrator CLI, a client of the control HTTP API.

`cli()` only exits with `main(argv)`; `main` parses, builds one `Client` from the environment
and runs one command. Every failure is one `leaseholdctl: ...` line on stderr and an exit code
(`controlplane.cli.exits`), never a traceback. The commands live in `controlplane/cli/`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from controlplane.cli import admin, execute, fleet, keys, policy, spend, trace, views
from controlplane.cli.client import REFUSED_TOKEN_FLAG, Client
from controlplane.cli.exits import EXIT_HELP, CtlError, Exit
from controlplane.cli.output import warn

GROUPS = (keys, views, execute, admin, policy, spend, fleet, trace)
TOKEN_FILE_HELP = (
    "a file holding the bearer token (else LEASEHOLD_TOKEN, GATEWAY_CONTROL_TOKEN, "
    "GATEWAY_MINT_TOKEN, GATEWAY_READ_TOKEN)"
)


def add_token_options(parser: argparse.ArgumentParser) -> None:
    """`--token-file`; `--token` is declared only to be refused (SPEC §19: a token on the command
    line is in the process listing), and so argparse never takes it for `--token-file`."""
    parser.add_argument("--token-file", metavar="PATH", help=TOKEN_FILE_HELP)
    parser.add_argument("--token", help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print the control daemon's raw answer")
    add_token_options(common)
    parser = argparse.ArgumentParser(
        prog="leaseholdctl",
        description="Operate a Leasehold gateway through its control API.",
        epilog=EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command_name", metavar="COMMAND", required=True)
    for group in GROUPS:
        group.register(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed by argparse
        return int(exc.code or 0) if not isinstance(exc.code, str) else Exit.USAGE
    if args.token is not None:
        warn(REFUSED_TOKEN_FLAG)
        return Exit.USAGE
    try:
        client = Client.from_env(os.environ, args.token_file)
        return int(args.run(args, client))
    except CtlError as exc:
        warn(exc.message)
        return int(exc.code)
    except KeyboardInterrupt:
        return 128 + 2
    except BrokenPipeError:  # `leaseholdctl routes | head`: silence the final flush too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return Exit.OK
    except Exception as exc:  # a bug or an answer of an unexpected shape: still one line
        warn(
            f"unexpected {type(exc).__name__}: {exc} (a bug in leaseholdctl, or a control daemon "
            "answering in a shape it does not know)"
        )
        return Exit.FAILED


def cli() -> None:
    sys.exit(main())


if __name__ == "__main__":
    cli()
