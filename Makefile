# Leasehold — `make run` and `make test` work on a fresh machine with only Python 3.11+.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: run fleet-demo test check format lock venv redis-server chromium test-clients bench bench-ab bench-peers soak soak-fleet clean

# The venv installs the exact releases of requirements-test.txt (the lock; `make lock` rewrites it
# from setup.cfg), then the project itself without resolving anything again.
$(STAMP): setup.cfg pyproject.toml requirements-test.txt
	@$(PYTHON) -c 'import sys; sys.exit("Python 3.11+ is required, found " + sys.version.split()[0]) if sys.version_info < (3, 11) else None'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-test.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
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

# The dashboard tests drive Debian's chromium (Playwright never downloads a browser of its own).
# On a fresh machine, as root, install it; otherwise say the one command that does (those tests
# then skip saying it too, and fail under CI).
CHROMIUM := /usr/bin/chromium
chromium:
	@test -x $(CHROMIUM) || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null || \
	      { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; }; \
	  else \
	    echo "chromium is missing, so the dashboard tests will skip (fail under CI); install it with: apt-get install -y chromium" >&2; \
	  fi; }

# The real-client tests run Claude Code and Codex CLI, unchanged, from npm, installed into
# TEST_CLIENTS (the tests read it as LEASEHOLD_TEST_CLIENTS). As root on a fresh machine, Node
# and npm come from apt-get first; without npm, say the commands (the tests skip, or fail under CI).
TEST_CLIENTS ?= $(HOME)/.cache/leasehold-test-clients
CLIENT_PACKAGES := @anthropic-ai/claude-code @openai/codex
test-clients:
	@test -x $(TEST_CLIENTS)/node_modules/.bin/claude -a -x $(TEST_CLIENTS)/node_modules/.bin/codex || { \
	  command -v npm >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm >/dev/null || \
	      { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm >/dev/null; }; \
	  if command -v npm >/dev/null 2>&1; then \
	    echo "installing $(CLIENT_PACKAGES) into $(TEST_CLIENTS)" >&2; \
	    npm install --prefix $(TEST_CLIENTS) --no-audit --no-fund --loglevel=error $(CLIENT_PACKAGES) >/dev/null; \
	  else \
	    echo "npm is missing, so the real-client tests will skip (fail under CI); install them with: apt-get install -y nodejs npm && npm install --prefix $(TEST_CLIENTS) $(CLIENT_PACKAGES)" >&2; \
	  fi; }

# Everything the suite needs is prepared above, before pytest starts; no test installs anything.
test: $(STAMP) redis-server chromium test-clients
	LEASEHOLD_TEST_CLIENTS=$(TEST_CLIENTS) $(BIN)/python -m pytest -q $(PYTEST_ARGS)

# `make check`: lint (ruff), types (mypy --strict on the shared
# contract and the pure cores, plain mypy on the daemons), and the shape tests: no module over
# 400 lines, no function over 60 (tests/test_shape.py); every name in ARCHITECTURE.md and docs/
# still exists; the rooms' imports; every imported distribution declared and locked; aiohttp's
# internals behind one module. Configured in pyproject.toml; tool versions pinned in setup.cfg.
check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy --strict shared controlplane/core
	$(BIN)/mypy controlplane dataplane
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_shape.py tests/test_docs_names.py \
	  tests/unit/test_architecture.py tests/unit/test_declared_dependencies.py tests/unit/test_aiohttp_private_api.py

# Rewrite the tree in ruff's format (what `make check` asks of every file).
format: $(STAMP)
	$(BIN)/ruff format .

# Re-resolve the lock from setup.cfg's ranges (after editing them), with pip-tools.
lock: $(STAMP)
	$(BIN)/python -m pip install --quiet pip-tools
	$(BIN)/pip-compile --quiet --extra test --strip-extras --no-emit-index-url --no-emit-find-links \
	  --no-emit-trusted-host -o requirements-test.txt setup.cfg

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
