# Two commands a newcomer needs: `make run` and `make test`. Both build .venv on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The web UI's terminal view (xterm.js from npm, at the version the script pins)
XTERM := supervisor/gateway/static/xterm/VERSION
# pytest-xdist workers for make test: the suite mostly waits on real processes and timers,
# so 3 on 2 cores (docs/development.md)
TEST_WORKERS ?= 3

.PHONY: run test install typecheck demo clean browser openssh postgresql bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

$(XTERM): scripts/vendor-xterm.sh
	@sh scripts/vendor-xterm.sh

install: $(STAMP) $(XTERM)

# make run ARGS='--port 0': serve's own options (agent-supervisor serve --help)
ARGS ?=

run: $(STAMP) $(XTERM)
	@$(VENV)/bin/agent-supervisor serve $(ARGS)

demo: $(STAMP) $(XTERM)
	$(VENV)/bin/agent-supervisor demo

typecheck: $(STAMP)
	$(PY) -m mypy supervisor protocols

browser:
	@sh scripts/ensure-chromium.sh

openssh:
	@sh scripts/ensure-openssh.sh

postgresql:
	@sh scripts/ensure-postgresql.sh

test: $(STAMP) $(XTERM) browser openssh postgresql
	$(PY) -m mypy supervisor protocols
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -n $(TEST_WORKERS)

# make bench BASE=REV: the headline figures of revision REV beside this tree's, in the same run
BASE ?=

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,bench]'
	$(PY) -m bench.run_all $(if $(BASE),--compare $(BASE))

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .hypothesis
