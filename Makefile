# fedpriv — all set-up happens here: `make run` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU wheel of torch 2.13.0 installs from local disk here; users with CUDA may set
# TORCH_SPEC to any torch >= 2.6 (e.g. TORCH_SPEC="torch==2.6.0").
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.fedpriv-installed

.PHONY: install run test test-all lint bench bench-accounting gpu-check data mnist-full clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/fedpriv $(ARGS)

# The fast tier: lint, types and every test not marked slow, on two processes (pytest-xdist;
# at most 10 minutes from a fresh clone on 2 cores).
test: lint
	$(PY) -m pytest -q -m "not slow" -n 2 --durations=20 tests $(PYTEST_ARGS)

# Everything (what .ci/run runs): `make test`, then the slow end-to-end runs in one process
# (they start Ray, share one Ray head and count its processes).
test-all: test
	$(PY) -m pytest -q -m slow --durations=20 tests $(PYTEST_ARGS)

# ruff (lint + format check) and mypy on the packages; part of `make test`, so CI runs them.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# bench_clients.py: 1,000 clients (all training) and 10^5 registered / 10^3 per round, each
# against the plain-torch compute floor in the same run; BENCH_ARGS adds options or Hydra
# overrides (e.g. BENCH_ARGS="--clients 1000 10000" or BENCH_ARGS="vmap_clients=true").
bench: $(STAMP)
	$(PY) benchmarks/bench_steps.py
	$(PY) benchmarks/bench_secagg.py --num-clients 10
	$(PY) benchmarks/bench_clients.py $(BENCH_ARGS)

bench-accounting: $(STAMP)
	$(PY) benchmarks/bench_accounting.py

gpu-check: $(STAMP)
	$(PY) benchmarks/gpu_check.py

# Rebuild the embedded Fashion-MNIST subset from the official IDX files.
data: $(STAMP)
	$(PY) scripts/make_embedded_fmnist.py --idx-dir $(or $(IDX_DIR),../shared/data/fashion-mnist)

# The four official MNIST IDX files (60k/10k) in data/mnist-full, offline and checksummed
# (scripts/get_full_mnist.py): the full-MNIST experiments read them.
mnist-full: $(STAMP)
	$(PY) scripts/get_full_mnist.py --out data/mnist-full --from-dir $(or $(MNIST_DIR),../shared/data/mnist)

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
