# Every target creates .venv and installs what it needs first; all are idempotent.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export TF_CPP_MIN_LOG_LEVEL := 2
export PYTHONPATH := $(CURDIR)

.PHONY: demo test test-fast bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): setup.py | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) scripts/train.py --task=classify --model_dir=runs/demo

test: $(STAMP)
	$(PY) -m pytest -q tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests

BENCHES := batching training packing pipeline splitting attention tbptt predict mixing multislot

bench: $(STAMP)
	mkdir -p bench_out
	@for b in $(BENCHES); do \
	  echo "== scripts/bench_$$b.py"; \
	  $(PY) scripts/bench_$$b.py --json_out=bench_out/$$b.json || exit 1; \
	done

clean:
	rm -rf $(VENV) runs bench_out .pytest_cache
