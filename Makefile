# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
	&& { echo $$p; break; }; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint pytest screenshots bench clean

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "shoal needs Python 3.11 or newer on PATH" >&2; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip 'setuptools>=77'
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/shoal demo

screenshots: $(STAMP)
	$(BIN)/python -m tui.screenshots screenshots
	$(BIN)/python -m tui.screenshots screenshots --live

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/python -m pytest -n auto $(PYTEST_ARGS)

test: lint pytest

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
