# Quarry: `make test` and `make demo` set up everything they need, idempotently.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV := .venv
PY := $(VENV)/bin/python
PY_STAMP := $(VENV)/.quarry-installed
NODE_STAMP := node_modules/.quarry-installed
ARTIFACTS_STAMP := artifacts/.quarry-compiled
SOL_SOURCES := $(shell find contracts -name '*.sol' -not -path '*/test/*' 2>/dev/null)

ABI_DIR := market/chain/abi

.PHONY: help setup redis postgres browser compile test test-contracts test-python test-python-long \
	test-python-rest test-smoke lint typecheck check-deps bench demo clean

help:
	@echo "make demo   run the marketplace locally"
	@echo "make test   run every test (lint, mypy, dependency check, Hardhat, pytest)"
	@echo "make bench  run every benchmark in benchmarks/"

setup: $(PY_STAMP) $(NODE_STAMP) redis postgres

# constraints.txt pins the CPU torch this repository tests with; pyproject.toml only has ranges.
$(PY_STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	@touch $@

$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing redis-server with apt-get"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	  else \
	    echo "redis-server is missing: run 'sudo apt-get install redis-server' and try again" >&2; exit 1; \
	  fi; }

# PostgreSQL for the board's second database (tests start private servers with initdb; Debian
# keeps initdb and postgres in /usr/lib/postgresql/<version>/bin, off PATH).
postgres:
	@command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing postgresql with apt-get"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; \
	  else \
	    echo "PostgreSQL is missing: run 'sudo apt-get install postgresql' and try again" >&2; exit 1; \
	  fi; }

# Debian's chromium and its driver, for the dashboard's browser tests (Selenium drives them).
browser:
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing chromium and chromium-driver with apt-get"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      chromium chromium-driver >/dev/null; \
	  else \
	    echo "chromium is missing: run 'sudo apt-get install chromium chromium-driver' and" \
	      "try again" >&2; exit 1; \
	  fi; }

# Compiles, then regenerates the ABIs shipped as package data ($(ABI_DIR), committed).
$(ARTIFACTS_STAMP): $(NODE_STAMP) $(PY_STAMP) hardhat.config.js $(SOL_SOURCES)
	npx hardhat compile --quiet
	$(PY) -m market.chain.artifacts artifacts
	@touch $@

compile: $(ARTIFACTS_STAMP)

lint: $(PY_STAMP)
	$(VENV)/bin/ruff check market miner verifier client tests benchmarks examples

# mypy over the four packages; its settings are [tool.mypy] in pyproject.toml.
typecheck: $(PY_STAMP)
	$(VENV)/bin/mypy

# pip's resolver against the package index: 'quarry[vllm]' must resolve with pyproject's ranges
# (2 to 3.5 minutes measured on a loaded 2-core machine; the script gives up after 7).
check-deps: $(PY_STAMP)
	$(PY) .ci/check_deps.py vllm --timeout 420

test-contracts: $(ARTIFACTS_STAMP)
	npx hardhat test

# pytest in two halves of about the same length, so both cores stay busy (see `test`): the
# five longest integration files, and every other file, new ones included. The benchmarks'
# smoke runs (test-smoke) are a job of their own.
LONG_TESTS := tests/test_chain_stateful.py tests/test_dashboard.py \
	tests/test_verifier_committee.py tests/test_verifier_e2e.py tests/test_swarm_devnet.py

test-python: test-python-long test-python-rest

test-python-long: setup browser $(ARTIFACTS_STAMP)
	$(PY) -m pytest -q --durations=10 $(LONG_TESTS)

test-python-rest: setup browser $(ARTIFACTS_STAMP)
	$(PY) -m pytest -q --durations=15 --ignore=tests/test_benchmarks_smoke.py \
	  $(addprefix --ignore=,$(LONG_TESTS))

test-smoke: setup $(ARTIFACTS_STAMP)
	$(PY) -m pytest -q tests/test_benchmarks_smoke.py

# pytest's two halves start first, one per core; ruff, mypy, the Hardhat suite and the
# benchmarks' smoke runs (~7 min together) follow one after another on whichever core is
# free first, which keeps `make test` inside its 20-minute budget on two cores.
test: setup
	$(MAKE) --no-print-directory -j2 test-python-long test-python-rest lint typecheck \
	  test-contracts test-smoke

bench: setup $(ARTIFACTS_STAMP)
	@set -e; for script in benchmarks/[!_]*.py; do \
	  echo "== $$script"; $(PY) $$script; done

# The whole marketplace on private Redis/Anvil/market/worker/miners; stops all it started
# (`make demo ARGS=--keep` leaves it running, dashboard and all, until Ctrl-C).
demo: setup $(ARTIFACTS_STAMP)
	$(PY) examples/demo.py $(ARGS)

clean:
	rm -rf artifacts cache .quarry .pytest_cache
