# Leasehold — `make run` and `make test` work on a fresh machine with only Python 3.11+.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: run fleet-demo test venv redis-server bench bench-ab bench-peers soak soak-fleet clean

$(STAMP): setup.cfg pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("Python 3.11+ is required, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m tests.support.devrun

# A local fleet (SPEC §16): one redis-server and two pairs on loopback sharing it; prints what to
# call; Ctrl-C stops every process it started. State and logs in ./var/fleet.
fleet-demo: $(STAMP) redis-server
	$(BIN)/python -m tests.support.fleetdemo

# The fleet tests start their own redis-server (loopback, nothing saved). On a fresh machine,
# as root, install it (updating the package lists only if the first try fails); otherwise say
# the one command that does (the fleet tests then fail saying it too; the rest still run).
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null || \
	      { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null; }; \
	  else \
	    echo "redis-server is missing, so the fleet tests will fail; install it with: apt-get install -y redis-server" >&2; \
	  fi; }

test: $(STAMP) redis-server
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m bench.run $(BENCH_ARGS)

# `make bench-ab`: saturation A/B against the commit bench/BASELINE names, built in a temporary
# worktree with its own venv (pip's cache); per-round ratios, median and range. AB_ARGS: --rounds
# N, --seconds S, --alone, --commit REV.
bench-ab: $(STAMP)
	$(BIN)/python -m bench.baseline $(AB_ARGS)

bench-peers: $(STAMP)
	$(BIN)/python -m bench.run --peers $(BENCH_ARGS)

# `make soak`: the single-host soak, then the fleet soak (three pairs sharing one redis-server,
# faults injected: bench/soak_fleet.py); SOAK_ARGS (--minutes / --seconds, --seed, --workers) go to
# both, FLEET_SOAK_ARGS (--summary PATH) to the fleet soak only. `make soak-fleet`
# runs the fleet soak alone.
soak: $(STAMP) redis-server
	$(BIN)/python -m bench.soak $(SOAK_ARGS)
	$(BIN)/python -m bench.soak --fleet $(SOAK_ARGS) $(FLEET_SOAK_ARGS)

soak-fleet: $(STAMP) redis-server
	$(BIN)/python -m bench.soak --fleet $(SOAK_ARGS) $(FLEET_SOAK_ARGS)

clean:
	rm -rf $(VENV) var build *.egg-info
