# Every target creates .venv and installs what it needs first; all are idempotent.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: demo test test-slow test-all test-fast bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): setup.py pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) scripts/train.py --task=classify --model_dir=runs/demo

# `make test`: every test but the slow end-to-end ones (under ~15 minutes on 2 cores);
# `make test-slow`: those (servers and binaries in separate processes); CI runs both.
# Tests run in TEST_WORKERS processes (pytest-xdist; 0: in this process). The default is one
# more than the cores, at most 4 (each holds a TensorFlow runtime): on 2 cores `make test`
# took 563 s with 3 workers against 579 s with 2 (the slow tests: 1,210 s either way);
# `worksteal` hands a long test's queue to an idle worker. From a fresh clone on 2 cores,
# `.ci/run` took 1,583-1,592 s: `make test` 520-524 s, `make test-slow` 1,016-1,021 s; on a
# day the machine ran ~35-60% slower (2026-11-27, night) 2,254 s: 868 s and 1,311 s;
# on 2026-11-28 2,500 s: 769 s and 1,654 s; later that day 2,361 s: 801 s and 1,498 s.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(4, len(os.sched_getaffinity(0)) + 1))")
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=15
test: $(STAMP)
	$(PYTEST) -m "not slow" tests

test-slow: $(STAMP)
	$(PYTEST) -m slow tests

test-all: test test-slow

test-fast: test

BENCHES := batching training packing pipeline scaling splitting attention tbptt predict mixing \
           multislot vocab startup sources steps

bench: $(STAMP)
	mkdir -p bench_out
	@for b in $(BENCHES); do \
	  echo "== python -m benchmarks.$$b"; \
	  $(PY) -m benchmarks.$$b --json_out=bench_out/$$b.json || exit 1; \
	done

clean:
	rm -rf $(VENV) runs bench_out .pytest_cache
