# Two commands: `make lab` opens the workbook, `make test` runs everything CI runs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.pipelab-installed
PORT ?= 8888
LAB_ARGS ?=
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: lab test unit notebooks clean-venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the requirement files change.
$(STAMP): requirements.txt pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --disable-pip-version-check -q -r requirements.txt -e .
	touch $@

lab: $(STAMP)
	$(BIN)/jupyter lab --ip=127.0.0.1 --port=$(PORT) --ServerApp.root_dir=notebooks \
		$(ALLOW_ROOT) $(LAB_ARGS)

# The notebooks run even when unit tests fail: both outcomes are reported on one line, and
# the target fails if either did.
test: $(STAMP)
	@unit=passed; notebooks=passed; \
	$(MAKE) --no-print-directory unit || unit=FAILED; \
	$(MAKE) --no-print-directory notebooks || notebooks=FAILED; \
	echo "make test: unit tests $$unit, notebooks $$notebooks"; \
	[ $$unit = passed ] && [ $$notebooks = passed ]

# Unit, multi-process and browser tests: on two workers, a whole test file per worker (its
# module-scoped clusters stay shared), then the wall-clock comparisons alone (run even when the
# first part fails; the target fails if either did).
unit: $(STAMP)
	@status=0; \
	PIPELAB_CI=1 $(BIN)/pytest -rs -n 2 --dist loadfile -m "not timing" tests || status=1; \
	PIPELAB_CI=1 $(BIN)/pytest -rs -m timing tests || status=1; \
	exit $$status

# Every notebook top to bottom, two notebooks at a time: --dist loadfile keeps each notebook's
# cells in order on one worker (a notebook holds up beside another: the load harness,
# benchmarks/under_load.py, runs each beside busy loops).
notebooks: $(STAMP)
	PIPELAB_CI=1 $(BIN)/pytest -rs -n 2 --dist loadfile --nbval-lax --nbval-current-env \
		--nbval-cell-timeout=120 -p no:cacheprovider notebooks/

clean-venv:
	rm -rf $(VENV)
