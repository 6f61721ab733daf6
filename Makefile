# Two entry points matter: `make run` (embedded broker + the demo pipeline) and `make test`.
# Both create .venv and install the pinned dependencies from pyproject.toml on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: setup system-deps run run-cluster test lint typecheck unit bench chaos clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

system-deps:
	bash scripts/ensure-system-deps.sh

setup: $(STAMP) system-deps

# embedded broker + orders pipeline on Spark local[*] (needs Java 17: system-deps), exactly once
run: setup
	$(BIN)/python -m exactly.demo $(RUN_ARGS)

# the same on ZooKeeper + 3 replicated brokers (topics RF 3, min.insync.replicas 2); one broker (the
# transaction coordinator or an output partition's leader) is killed with kill -9 after 2 micro-batches
# and restarted once the cluster dropped it; the verification must still pass
run-cluster: setup
	$(BIN)/python -m exactly pipeline demo --cluster 3 --kill-broker-after 2 $(RUN_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

# two pytest-xdist workers: the suite mostly waits on broker, ZooKeeper and Spark subprocesses, so two
# workers on two cores halve the wall time; the run still starts one ZooKeeper and one Spark session
# (tests/support/shared_zookeeper.py; --dist loadgroup keeps the tests of the session's SparkSession on
# one worker, and the slow tests are handed out first so both workers finish together:
# tests/support/scheduling.py). src is byte-compiled first, as an installed wheel is: the tests start
# hundreds of broker processes, which would otherwise each compile every module where
# PYTHONDONTWRITEBYTECODE is set
test: setup lint typecheck
	$(BIN)/python -m compileall -q src
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=15 -n 2 --dist loadgroup

bench: setup
	$(BIN)/python bench/run.py $(BENCH_ARGS)

# Jepsen-style chaos runs (tests/chaos/run.py, tests/chaos/README.md): `make chaos RUNS=50 SEED=1 [CHAOS_ARGS=--duration 20]`;
# on a three-broker ZooKeeper cluster: `make chaos RUNS=50 CHAOS_ARGS="--cluster 3 --duration 15"`
RUNS ?= 5
SEED ?= 1
chaos: $(STAMP)
	$(BIN)/python -m tests.chaos.run --runs $(RUNS) --seed $(SEED) $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
