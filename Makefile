# Set-up and checks. `make demo` and `make test` work on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.dl2-installed
BENCH_STAMP := $(VENV)/.dl2-bench-installed
# `make bench BENCH="--quick"` (or a suite: BENCH="eval --filter send")
BENCH ?=

.PHONY: install demo test test-fast lint bench gpu-check browser-check clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch is pinned first: an open range would pull a multi-GB CUDA build.
$(STAMP): $(BIN)/python pyproject.toml setup.py src/dl2/_speedups.c
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/dl2 run --json dl2-demo.json -n 2 examples/sendsend.py; \
	  rc=$$?; echo "dl2 exited with status $$rc (3 = deadlock detected)"; test $$rc -eq 3

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

# The whole suite, what CI runs: lint, types, pure tests and real multi-process jobs.
# The recorder's unit tests run once more without its optional C part (dl2._speedups).
test: $(STAMP) lint
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q tests
	DL2_PURE_PYTHON=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q \
	  tests/unit/test_speedups.py tests/unit/test_record_unit.py tests/unit/test_records.py \
	  tests/unit/test_device_hold.py tests/unit/test_store.py

# The edit loop: pure functions, gold files, fake-rank monitors; no torch job (< 1 min).
test-fast: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m "not integration" tests

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m benchmarks $(BENCH)

# dl2 on CUDA tensors, NCCL groups and a Flight Recorder dump (one GPU, < 5 min); skips
# with a message where there is no CUDA device.  Needs no install: the source tree, torch,
# msgspec and rich.  Output (log, runs, dumps) under $$OUT, else dl2-gpu-check/.
GPU_PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PY))
gpu-check:
	PYTHONPATH=src $(GPU_PY) benchmarks/gpu_check.py

# Every benchmark case's report.html loaded in headless Chromium (Debian's package, not a
# downloaded build): fails on any console error; screenshots in benchmarks/results/html/.
# Not part of `make test`: CI needs no browser. BROWSER_CHECK="--filter send --fresh"
BROWSER_CHECK ?=
browser-check: $(STAMP)
	test -x /usr/bin/chromium || (apt-get update -qq && apt-get install -y -qq chromium)
	$(BIN)/python -m pip install -q -e '.[dev,browser]'
	OMP_NUM_THREADS=1 $(BIN)/python -m benchmarks.html_check $(BROWSER_CHECK)

clean:
	rm -rf $(VENV) dl2-runs dl2-gpu-check .pytest_cache .mypy_cache .ruff_cache
