# make setup: create or refresh .venv (idempotent; fast when nothing changed)
# make demo:  setup, then the main job on an embedded default
# make test:  setup, then the whole test suite (CI)
# make targets-env: the training/serving targets' own packages (torchtitan, DeepSpeed, Accelerate) in
#                   .venv-targets, a pip --target folder beside .venv (never in it) that
#                   tests/test_emit_roundtrip.py puts on sys.path for its real-parser round trips
# make test-fast: setup, then the fast tier: no test that starts a process or runs CP-SAT (seconds)
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fast lint bench clean validation plans targets-env

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

# Pinned, --no-deps: torch stays the CPU build of .venv (no resolver may pull a CUDA torch); the
# list is each package plus the pure-Python modules its config parser imports (torchtitan 0.3.0's
# import chain needs datasets, pyarrow and triton, which installs as a plain wheel without a GPU;
# SGLang's server_args needs the web-server stack, IPython and aiohttp, not its CUDA kernels;
# megatron-core for its --pipeline-model-parallel-layout parser, PipelineParallelLayerLayout; torchao for
# torchtitan's Float8LinearConverter, which a Float8 job builds while it is parsed).
# DeepSpeed is an sdist: DS_BUILD_OPS=0 builds no kernels, --no-build-isolation lets its setup.py see torch.
TARGETS_DIR := .venv-targets
TARGETS_STAMP := $(TARGETS_DIR)/.installed
TARGET_PKGS := torchtitan==0.3.0 tyro==1.0.17 docstring_parser==0.18.0 typeguard==4.6.1 shtab==1.13.0 \
	spmd_types==0.2.3 torchdata==0.11.0 tokenizers==0.23.3 tensorboard==2.21.0 triton==3.9.0 \
	datasets==5.2.0 pyarrow==26.0.1 dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0 fsspec==2026.9.0 \
	huggingface_hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2 h11==0.16.0 idna==3.20 truststore==0.10.5 \
	filelock==4.3.1 tqdm==4.70.1 safetensors==0.8.0 psutil==7.2.2 einops==0.8.2 \
	accelerate==1.15.0 deepspeed==0.19.8 hjson==3.1.0 py_cpuinfo==9.0.0 msgpack==1.2.4 \
	pydantic==2.14.4 pydantic_core==2.50.5 annotated_types==0.8.0 typing_inspection==0.4.5 \
	sglang==0.5.23 orjson==3.13.0 pybase64==1.5.1 requests==2.34.2 urllib3==2.8.0 certifi==2026.10.19.post1 \
	starlette==1.10.0 anyio==4.16.0 msgspec==0.23.0 pyzmq==27.3.0 ipython==9.18.1 traitlets==5.16.1 \
	aiohttp==3.14.5 multidict==7.2.1 attrs==26.1.0 yarl==1.25.1 propcache==0.5.4 aiohappyeyeballs==2.7.1 \
	aiosignal==1.4.0 frozenlist==1.8.0 megatron-core==0.16.1 torchao==0.18.0

targets-env: $(TARGETS_STAMP)

$(TARGETS_STAMP): Makefile $(STAMP)
	rm -rf $(TARGETS_DIR)
	@# a registry hiccup must not fail the suite: without the folder the round trips skip and say why
	DS_BUILD_OPS=0 $(BIN)/python -m pip install -q --no-deps --no-build-isolation --target $(TARGETS_DIR) $(TARGET_PKGS) \
	    || { echo "targets-env: the targets' packages did not install; their round-trip tests will skip" >&2; \
	         rm -rf $(TARGETS_DIR); mkdir -p $(TARGETS_DIR); touch $(TARGETS_DIR)/.failed; }
	@test -f $(TARGETS_DIR)/.failed || touch $@

demo: setup
	$(BIN)/python -m planner.cli.demo

test: setup targets-env
	$(BIN)/python -m pytest tests -q -x --timeout=600

test-fast: setup
	$(BIN)/python -m pytest tests -q --fast --timeout=120

bench: setup
	$(BIN)/python bench/bench_estimate.py

validation: setup
	$(BIN)/planner validate --write costmodel/VALIDATION.md > /dev/null
	$(BIN)/planner validate --cross --write-bands --write docs/validation.md > /dev/null
	$(BIN)/python -m planner.cli.validation_inference --write-validation costmodel/VALIDATION_INFERENCE.md
	$(BIN)/python -m planner.cli.uncertainty_bands --write

plans: setup
	$(BIN)/python -m planner.cli.examples
	$(BIN)/python -m planner.cli.regen_golden

clean:
	rm -rf $(VENV) $(TARGETS_DIR)

# make readme: rerun the README's five-minute tour, rewrite its section and the report screenshot
.PHONY: readme
readme: setup
	$(BIN)/python -m planner.cli.tour --write README.md --screenshot docs

lint: setup
	$(BIN)/ruff check .

# make docs: rewrite the generated blocks of the README and docs/*.md (tests/test_docs_pages.py
# fails when one is stale: after `make validation`, `make plans` or a changed flag, run this)
.PHONY: docs
docs: setup
	$(BIN)/python -m planner.cli.docs_pages --write
