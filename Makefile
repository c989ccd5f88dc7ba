# The two commands of the README. Each sets up everything it needs on a fresh machine.
#   make demo   the main job on the embedded tiny model (CPU, offline)
#   make test   the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.genaug-installed

.PHONY: demo test test-slow lint bench reliability install clean

$(STAMP): pyproject.toml constraints/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# The constraints file pins the CPU torch wheel; GPU users install without it. fp8 (torchao):
	# its tests run the product's FP8 path on the CPU, and the service's quiet start with it.
	$(BIN)/python -m pip install --quiet -c constraints/cpu.txt -e '.[dev,trainer,fp8]'
	touch $(STAMP)

# KEDA's CRD schemas (npm @kubernetes-models/keda, pinned in tools/keda-schema's lock) for
# tests/docker/test_keda.py, which validates docker/k8s/keda.yaml with them under node.
KEDA_DIR := .cache/keda-models
KEDA := $(KEDA_DIR)/node_modules/@kubernetes-models/keda/package.json

$(KEDA): tools/keda-schema/package.json tools/keda-schema/package-lock.json
	mkdir -p $(KEDA_DIR)
	cp tools/keda-schema/package.json tools/keda-schema/package-lock.json $(KEDA_DIR)/
	cd $(KEDA_DIR) && npm ci --no-audit --no-fund --loglevel=error
	touch $(KEDA)

install: $(STAMP) $(KEDA)

demo: $(STAMP)
	$(BIN)/genaug demo

# Two workers or more (pytest-xdist, one per core), each test file whole on one worker (its
# module fixtures built once): most tests wait on a service, a child process or the network,
# so two cores run two files at once, the longest files first (tests/durations.json, in the
# order tests/conftest.py sorts them; --no-loadscope-reorder keeps it), so that both workers
# end together. --durations: the slowest tests in every run's log, and the last line the load
# average, to keep the suite under 10 minutes on a busy 2-core machine.
test: $(STAMP) $(KEDA)
	$(BIN)/python -m pytest -n auto --dist loadfile --no-loadscope-reorder --durations=15

# The long tests (torch.compile, benchmarks in --tiny mode, end-to-end runs of several
# processes: replicas on PostgreSQL, reliability's load, kill and fuzz runs, two TensorFlow
# workers), kept out of `make test` to hold it under 10 minutes on a busy 2-core machine; CI
# runs them after it.
test-slow: $(STAMP) $(KEDA)
	$(BIN)/python -m pytest -m slow --durations=6

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy service client feeding trainer genaug torchfeed

bench: $(STAMP)
	$(BIN)/python -m bench all

reliability: $(STAMP)
	$(BIN)/python -m reliability --full

clean:
	rm -rf $(VENV) $(KEDA_DIR) .pytest_cache .mypy_cache .ruff_cache
