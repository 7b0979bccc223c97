# Every target creates .venv and installs what it needs first; all are idempotent.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: demo test test-slow test-all test-fast bench bench-peers clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): setup.py pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) scripts/train.py --task=classify --model_dir=runs/demo

# `make test`: every test but the slow ones; `make test-slow`: the slow end-to-end tests
# (servers and binaries in separate processes); CI runs both. `make bench`: each benchmark in
# BENCHES, its table on stdout and its JSON in bench_out/ (docs/benchmarks.md).
# Tests run in TEST_WORKERS processes (pytest-xdist; 0: in this process), by default one more
# than the cores, at most 4 (each holds a TensorFlow runtime), each module whole on one worker
# (`loadscope`), so a run a module's tests share (a module fixture) is trained once.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(4, len(os.sched_getaffinity(0)) + 1))")
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope --durations=15
test: $(STAMP)
	$(PYTEST) -m "not slow" tests

test-slow: $(STAMP)
	$(PYTEST) -m slow tests

test-all: test test-slow

test-fast: test

BENCHES := batching training packing pipeline scaling splitting attention tbptt predict mixing \
           multislot vocab startup sources steps keras_hub

bench: $(STAMP)
	mkdir -p bench_out
	@for b in $(BENCHES); do \
	  echo "== python -m benchmarks.$$b"; \
	  $(PY) -m benchmarks.$$b --json_out=bench_out/$$b.json || exit 1; \
	done

# `make bench-peers`: tfseq against Grain and seqio (benchmarks/peers.py). The peers are no
# dependency of tfseq: they go into their own environment, .venv-peers, with tfseq (editable)
# and exact pins; their requirements leave tensorflow and tensorflow-text at 2.21 (they add
# jax, flax, tensorflow-datasets and what those import).
PEERS_VENV := .venv-peers
PEERS_PY := $(PEERS_VENV)/bin/python
PEERS_STAMP := $(PEERS_VENV)/.installed
PEERS := grain==0.2.18 seqio==0.0.20

$(PEERS_STAMP): setup.py pyproject.toml
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_PY) -m pip install -q --upgrade pip
	$(PEERS_PY) -m pip install -q -e . $(PEERS)
	touch $(PEERS_STAMP)

bench-peers: $(PEERS_STAMP)
	mkdir -p bench_out
	$(PEERS_PY) -m benchmarks.peers --json_out=bench_out/peers.json

clean:
	rm -rf $(VENV) $(PEERS_VENV) runs bench_out .pytest_cache
