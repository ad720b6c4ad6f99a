#!/usr/bin/env bash
# `make gpu-check`: the prepared accelerator check (jaxrl_llm/benchmarks/gpu/gpu_check.py) on a
# machine with no network. Python packages the project needs beyond what the machine has can
# travel as wheels in .whl/ (e.g. gguf): each is installed (into /tmp/gpu_check_site, no
# dependencies resolved) only when its package cannot be imported or its version differs.
# SmolLM2's tokenizer files can travel in .gpu_carry/tokenizer (for the RL run's prompts).
# Prepared on a machine with the project's venv and network (both folders are git-ignored locally):
#   .venv/bin/python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --platform manylinux2014_x86_64 -d .whl gguf==0.19.0 flax==0.12.8 chex==0.1.92 optax==0.2.8
#   d=$(.venv/bin/python -c "from jaxrl_llm import bridge; print(bridge.smollm2_hf_dir())")
#   mkdir -p .gpu_carry/tokenizer && cp "$d"/*.json .gpu_carry/tokenizer/
#   OUT=dir bash launch/gpu_check.sh [gpu_check.py args...]
# GPU_MODULE=jaxrl_llm.benchmarks.gpu.gpu_sweep runs the sweep (`make gpu-sweep`) the same way.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
OUT_DIR=${OUT:-benchmarks/results}
if compgen -G ".whl/*.whl" >/dev/null; then
  need=()
  for wheel in .whl/*.whl; do
    name=$(basename "$wheel" | cut -d- -f1); version=$(basename "$wheel" | cut -d- -f2)
    have=$($PY -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || true)
    [ "$have" = "$version" ] || need+=("$wheel")
    echo "[gpu-check] $name: have '${have:-none}', carried $version"
  done
  if [ ${#need[@]} -gt 0 ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/gpu_check_site "${need[@]}"
    export PYTHONPATH=/tmp/gpu_check_site${PYTHONPATH:+:$PYTHONPATH}
  fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=true \
  XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92} \
  TF_CPP_MIN_LOG_LEVEL=3 GPU_CHECK_COMMIT=${GPU_CHECK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
tokenizer=()
[ -f .gpu_carry/tokenizer/tokenizer.json ] && tokenizer=(--tokenizer-dir .gpu_carry/tokenizer)
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,temperature.gpu --format=csv 2>/dev/null || true
exec $PY -m "${GPU_MODULE:-jaxrl_llm.benchmarks.gpu.gpu_check}" --out-dir "$OUT_DIR" "${tokenizer[@]}" "$@"
