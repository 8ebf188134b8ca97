# make setup: create or refresh .venv (idempotent; fast when nothing changed)
# make demo:  setup, then the main job on an embedded default
# make test:  setup, then the whole test suite (CI)
# make test-fast: setup, then the fast tier: no test that starts a process or runs CP-SAT (seconds)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast lint bench clean validation plans

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@# No NVIDIA GPU: pin the CPU build of torch first (a local wheel on these machines),
	@# so the dependency resolver never pulls a multi-GB CUDA build.
	@if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then \
	    $(BIN)/python -m pip install -q "torch==2.13.0" || $(BIN)/python -m pip install -q "torch>=2.8" --index-url https://download.pytorch.org/whl/cpu; \
	fi
	$(BIN)/python -m pip install -q -e ".[dev]"
	@touch $(STAMP)

demo: setup
	$(BIN)/python -m planner.cli.demo

test: setup
	$(BIN)/python -m pytest tests -q -x --timeout=600

test-fast: setup
	$(BIN)/python -m pytest tests -q --fast --timeout=120

bench: setup
	$(BIN)/python bench/bench_estimate.py

validation: setup
	$(BIN)/planner validate --write costmodel/VALIDATION.md > /dev/null
	$(BIN)/python -m planner.cli.validation_inference --write-validation costmodel/VALIDATION_INFERENCE.md

plans: setup
	$(BIN)/python -m planner.cli.examples
	$(BIN)/python -m planner.cli.regen_golden

clean:
	rm -rf $(VENV)

# make readme: rerun the README's five-minute tour, rewrite its section and the report screenshot
.PHONY: readme
readme: setup
	$(BIN)/python -m planner.cli.tour --write README.md --screenshot docs

lint: setup
	$(BIN)/ruff check .
