# Two entry points matter: `make run` (embedded broker + the demo pipeline) and `make test`.
# Both create .venv and install the pinned dependencies from pyproject.toml on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: setup system-deps run test lint typecheck unit bench chaos clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

system-deps:
	bash scripts/ensure-system-deps.sh

setup: $(STAMP) system-deps

run: setup
	$(BIN)/python -m exactly.demo

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

test: setup lint typecheck
	$(BIN)/python -m pytest -q -p no:cacheprovider

bench: setup
	$(BIN)/python bench/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
