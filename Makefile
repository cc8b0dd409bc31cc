# The two commands: `make demo` runs the main job, `make test` runs the test suite.
# Both set up everything first (idempotent: a second call skips what is done).
VENV := .venv
PY := $(VENV)/bin/python
DEMO_DIR ?= runs/demo

.PHONY: setup demo test clean

setup:
	@bash scripts/setup.sh

demo: setup
	@bash scripts/demo.sh $(DEMO_DIR)

test: setup
	@$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf runs .pytest_cache
