# Two commands on a fresh machine: `make demo` and `make test`. Both install exactly uv.lock.
PYTHON ?= $(shell for p in python3.11 python3.12 python3.13 python3; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
	&& { echo $$p; break; }; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# uv itself comes from PyPI by hash (tools/uv-requirements.txt), into a folder of its own.
TOOLS := .tools
UV := $(TOOLS)/bin/uv
# Most tests wait on real agents, links and timers rather than compute: two test workers per
# core keep the cores busy (the suite on 2 cores: 13.5 min with 4 workers, 18.9 min with 2).
WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); n=$$((2 * n)); [ $$n -gt 16 ] && n=16; echo $$n)
export UV_PYTHON_DOWNLOADS := never
export UV_PROJECT_ENVIRONMENT := $(VENV)

.PHONY: install demo test lint pytest docs screenshots bench lock test-latest clean

$(UV): tools/uv-requirements.txt
	@test -n "$(PYTHON)" || { echo "shoal needs Python 3.11 or newer on PATH" >&2; exit 1; }
	@test -x $(TOOLS)/bin/python || $(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install -q --disable-pip-version-check --require-hashes \
		-r tools/uv-requirements.txt
	@touch $(UV)

$(STAMP): $(UV) pyproject.toml uv.lock
	$(UV) sync --locked --quiet --python $(PYTHON)
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/shoal demo

screenshots: $(STAMP)
	$(BIN)/python -m tools.screenshots screenshots
	$(BIN)/python -m tools.screenshots screenshots --live

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

docs: $(STAMP)
	@if [ -f mkdocs.yml ]; then NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir .site; fi

pytest: $(STAMP)
	$(BIN)/python -m pytest -n $(WORKERS) $(PYTEST_ARGS)

test: lint docs pytest

# Update the lock on purpose (newest versions the ranges in pyproject.toml allow).
lock: $(UV)
	$(UV) lock --upgrade

# The suite against the newest versions the ranges allow, in a separate environment: run it
# before `make lock`, and when a dependency releases (not in CI: it would drift by itself).
test-latest: $(UV)
	$(UV) venv --quiet --allow-existing --python $(PYTHON) .venv-latest
	VIRTUAL_ENV=.venv-latest $(UV) pip install --quiet --upgrade -e . --group dev
	.venv-latest/bin/python -m pytest -n $(WORKERS) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .venv-latest $(TOOLS) .site .pytest_cache .mypy_cache .ruff_cache
