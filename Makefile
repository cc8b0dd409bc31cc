# The two commands: `make demo` runs the main job, `make test` runs the test suite.
# Both set up everything first (idempotent: a second call skips what is done).
VENV := .venv
PY := $(VENV)/bin/python
DEMO_DIR ?= runs/demo

.PHONY: setup demo test lint screenshot clean

setup:
	@bash scripts/setup.sh

demo: setup
	@bash scripts/demo.sh $(DEMO_DIR)

test: setup lint
	@$(PY) -m pytest $(PYTEST_ARGS)

# ruff and mypy over the project (their settings: pyproject.toml). mypy's cache lies outside the clone, so that a
# new clone checks only what changed (the cache checks each file's hash). The scripts benchmarks write beside their
# results (benchmarks/results/*/logs, not committed) are not the project's code.
MYPY_CACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/hvd-ddp-compare/mypy
lint: setup
	@$(VENV)/bin/ruff check .
	@MYPY_CACHE_DIR=$(MYPY_CACHE_DIR) $(VENV)/bin/mypy --exclude '^benchmarks/results/'

# README's screenshot: the first screen of make demo's report.html, in headless Chromium
screenshot:
	@$(PY) tests/browser.py $(DEMO_DIR) docs/images/report.png

clean:
	rm -rf runs .pytest_cache
