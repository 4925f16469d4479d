# Two commands: `make run` (set up everything and serve) and `make test` (the whole suite).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck setup bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,a-evolve]'
	touch $(STAMP)

setup: $(STAMP)
	$(PY) manage.py migrate --noinput
	$(PY) manage.py crucible_setup

run: setup
	$(PY) manage.py serve

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# The type checker over the apps (settings in pyproject.toml's [tool.mypy]).
typecheck: export CRUCIBLE_DATA_DIR := $(CURDIR)/var/test
typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Tests keep their database, broker queue and keys apart from the data `make run` uses.
test: export CRUCIBLE_DATA_DIR := $(CURDIR)/var/test
test: lint typecheck
	$(PY) -m pytest $(PYTEST_ARGS)

bench: setup
	$(PY) bench/event_latency.py
	$(PY) bench/worktree_creation.py
	$(PY) bench/compare_trees.py
	$(PY) bench/sandbox_overhead.py
	$(PY) bench/egress_overhead.py
	$(PY) bench/search_orchestration.py
	$(PY) bench/truth_costs.py
	$(PY) bench/planner_scale.py
	$(PY) bench/step_costs.py
	$(PY) bench/sqlite_writers.py
	$(PY) bench/distributed_workers.py
	$(PY) bench/selection_accuracy.py
	$(PY) bench/llm_tool_loop.py
	$(PY) bench/search_detail_scale.py
	$(PY) bench/ws_fanout.py
	$(PY) bench/evolution_cycle.py
	$(PY) bench/a_evolve_workspaces.py
	$(PY) bench/page_speed.py

clean:
	rm -rf $(VENV) var .pytest_cache
