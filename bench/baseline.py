"""`make bench-ab`: this checkout against the commit `bench/BASELINE` names, interleaved A/B.

`python -m bench.baseline [--rounds 6] [--seconds 2.5] [--alone] [--commit REV] [--instructions] [--rate 50 ...]`
(every other option goes to `bench.ab`) checks the baseline commit out into a temporary git
worktree, gives it a venv of its own (its own `setup.cfg`'s dependencies, installed through
pip's cache, so the second build is quick), runs
`bench.ab` with that tree as a column (its daemons started with its own venv's python: see
`bench.procs.module_argv`) and prints every round's ratio, current / baseline and current /
minimal proxy, before the median and range. `--instructions` then counts each daemon's
instructions per request in both trees (`bench.instructions --control`, callgrind) and prints
their ratio per process: the one figure the shared machine's load does not move. The worktree
and its venv are removed at the end.

Rule (issue 27): the baseline moves only when the ratio is ≥ 1.0 over its whole range; every
closing note quotes this ratio, not the ratio to the commit before.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import ab, instructions

REPO = Path(__file__).resolve().parent.parent
BASELINE_FILE = Path(__file__).resolve().parent / "BASELINE"


def baseline_commit() -> str:
    """The first word of `bench/BASELINE` (the rest of the file is free text)."""
    words = BASELINE_FILE.read_text().split()
    if not words:
        raise SystemExit(f"{BASELINE_FILE} names no commit")
    return words[0]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout.strip()


def build(commit: str, into: Path) -> Path:
    """A detached worktree of `commit` at `into`, with `.venv` holding its dependencies."""
    _git("worktree", "add", "--detach", "--force", str(into), commit)
    subprocess.run([sys.executable, "-m", "venv", str(into / ".venv")], check=True)
    pip = [str(into / ".venv" / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    # -e: the tree's own modules are what run; the install brings its dependency pins.
    done = subprocess.run([*pip, "-e", str(into)], cwd=str(into), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"installing the baseline's dependencies failed:\n{done.stderr[-4000:]}")
    return into


def remove(tree: Path) -> None:
    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], capture_output=True)
    subprocess.run(["git", "-C", str(REPO), "worktree", "prune"], capture_output=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", help="compare against this instead of bench/BASELINE's")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=2.5, help="measured window per round")
    parser.add_argument("--alone", action="store_true", help="the proxy under test alone on a core")
    parser.add_argument(
        "--instructions", action="store_true", help="then each daemon's instructions per request (needs valgrind)"
    )
    args, passed = parser.parse_known_args(argv)  # the rest (--rate ...) goes to bench.ab
    commit = _git("rev-parse", "--short", args.commit or baseline_commit())
    with tempfile.TemporaryDirectory(prefix="leasehold-baseline-") as tmp:
        tree = Path(tmp) / f"baseline-{commit}"
        print(f"building the baseline {commit} in {tree} (own venv, pip's cache)", flush=True)
        try:
            build(commit, tree)
            ab_args = ["--rounds", str(args.rounds), "--seconds", str(args.seconds), str(tree)]
            done = ab.main(ab_args + (["--alone"] if args.alone else []) + passed)
            if args.instructions and done == 0:
                print("instructions per request (callgrind; the machine's load does not move them)", flush=True)
                done = instructions.main(["--control", str(tree)])
            return done
        finally:
            remove(tree)


if __name__ == "__main__":
    raise SystemExit(main())
