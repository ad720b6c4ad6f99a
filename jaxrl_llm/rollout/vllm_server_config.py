"""How a vLLM server is run: its settings (`VLLMServerConfig`), checked before anything starts,
and the command line and environment they become (`server_command`, `server_env`).
`vllm_server.VLLMServer` starts and stops the process.

Flags that matter for RL:
  --logprobs-mode processed_logprobs  the sampled token's logprob is taken
      after temperature (and top-k/top-p), i.e. the mu the sample was
      actually drawn from (docs/objectives.md#sampler-support).
  --generation-config vllm  ignore the model's generation_config.json, whose
      sampling defaults (temperature, top_p) would silently apply to any
      request field we left out.
  --no-enable-chunked-prefill  every prompt is prefilled in one scheduler
      step (see VLLMServerConfig.chunked_prefill): on a CPU server a seeded
      request whose prefill is split kills the engine.
  --worker-extension-cls jaxrl_worker.JaxrlWorkerExtension  for a mixture-of-experts model
      (vllm_worker/, on PYTHONPATH): the routed-experts capture (jaxrl_routing_capture.py) and the
      weight reload that repacks vLLM's CPU experts (jaxrl_moe_reload.py, used by weight sync).
  --no-enable-prefix-caching  only with return_routed_experts: the worker records the experts
      every token was routed to; a prompt token served from the prefix cache is not forwarded,
      so it would have no routing.
  VLLM_SERVER_DEV_MODE=1  enables /collective_rpc (reload_weights) and
      /reset_prefix_cache. These let any caller run worker methods, which is
      why a non-loopback host requires an API key.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
from pathlib import Path
from typing import Mapping, Sequence

# The folder holding the worker extension of MoE servers (routed experts capture, MoE weight reload);
# it is put on the server's PYTHONPATH alone (the vLLM environment has no jaxrl_llm).
ROUTING_CAPTURE_DIR = Path(__file__).with_name("vllm_worker")
ROUTING_CAPTURE_EXTENSION = "jaxrl_worker.JaxrlWorkerExtension"

DTYPES = ("float32", "bfloat16", "float16", "auto")
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
# vLLM's defaults for an OpenAI server on CPU (vllm/engine/arg_utils.py
# get_batch_defaults): tokens per scheduler step, and sequences per step.
VLLM_CPU_DEFAULT_BATCHED_TOKENS = 2048
VLLM_CPU_DEFAULT_MAX_NUM_SEQS = 128
# What every server's environment sets besides VLLM_SERVER_DEV_MODE (and, on CPU, its KV-cache size):
# no usage reports, no hub downloads, unbuffered logs.
QUIET_OFFLINE_ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
                     "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_model_dir(model_dir: Path) -> None:
    """The server needs an HF-format directory: config.json, safetensors, tokenizer."""
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory {model_dir} does not exist; expected an HF-format "
                                "directory (config.json, *.safetensors, tokenizer files), e.g. from "
                                "jaxrl_llm.bridge.save_hf_dir")
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"model directory {model_dir} has no config.json; expected an HF-format "
                                "directory (config.json, *.safetensors, tokenizer files)")
    if not any(model_dir.glob("*.safetensors")):
        raise FileNotFoundError(f"model directory {model_dir} has no *.safetensors weight files")


@dataclasses.dataclass(frozen=True)
class VLLMServerConfig:
    """How to run one vLLM server.

    Attributes:
      model_dir: HF-format model directory (config, safetensors, tokenizer).
      host: bind address; loopback by default. Anything else needs api_key.
      port: TCP port; None picks a free one.
      dtype: "float32", "bfloat16", "float16" or "auto".
      max_model_len: context length (prompt + completion).
      kv_cache_gib: VLLM_CPU_KVCACHE_SPACE in GiB (integer, CPU backend).
      chunked_prefill: let vLLM split a prompt's prefill over several
        scheduler steps. Off by default, because on CPU it kills the server
        as soon as a seeded request is split: vLLM samples a token for every
        scheduled request, throws it away when the request's prefill is not
        finished, and rewinds that request's seeded torch generator with
        `gen.set_offset(gen.get_offset() - 4)`
        (vllm/v1/worker/gpu_model_runner.py, `_bookkeeping_sync`). CPU
        generators have no offset ("RuntimeError: CPU Generator does not use
        offset"), and every RL rollout is seeded. With it off, vLLM admits a
        waiting prompt only when its whole prefill fits in the step's token
        budget; otherwise that prompt, and the ones queued after it, wait for
        the next step. A budget alone cannot prevent the split: with chunked
        prefill on, the scheduler fills whatever budget is left with a piece
        of the next prompt. Safe to turn on for a GPU server.
      max_num_batched_tokens: tokens one scheduler step may process; None
        means max(max_model_len, 2048), 2048 being vLLM's CPU default.
        Without chunked prefill it must be >= max_model_len (a longer prompt
        could never be scheduled, and vLLM refuses to start).
      max_num_seqs: sequences the server decodes at once; None leaves vLLM's CPU default
        (128). A benchmark against an engine that decodes a whole batch sets it >= the batch.
      api_key: bearer token the server requires (required off loopback).
      seed: server-wide seed.
      enforce_eager: skip torch.compile. On CPU this saves the inductor
        compile that vLLM 0.32 redoes on every start, and generates more
        slowly: right for tests and short jobs, wrong for long training runs
        (measurements: docs/benchmarks.md).
      logprobs_mode: "processed_logprobs" (after temperature; what RL needs)
        or "raw_logprobs".
      dev_mode: set VLLM_SERVER_DEV_MODE=1 (weight reload endpoints).
      return_routed_experts: record, for every token the server forwards, the experts each MoE
        layer routed it to, for routing replay (`VLLMClient(return_routed_experts=True)` fetches
        them into `RolloutRecord.routed_experts`). Needs a mixture-of-experts model, dev_mode and
        enforce_eager (a compiled model was traced before the routing hook exists and never
        calls it); turns prefix caching off. vLLM 0.32's own --enable-return-routed-experts needs its V2
        model runner, which needs triton-cpu, so on CPU a worker extension does it
        (vllm_worker/jaxrl_routing_capture.py).
      served_model_name: the model name requests must use.
      startup_timeout_s: how long to wait for /health.
      log_path: server log file; None writes into a fresh temp directory.
      python: interpreter with vLLM; None uses vllm_env.vllm_python().
      extra_args: more CLI flags for the api_server.
      extra_env: more environment variables for the server process.
    """

    model_dir: str | Path
    host: str = "127.0.0.1"
    port: int | None = None
    dtype: str = "bfloat16"
    max_model_len: int = 1024
    kv_cache_gib: int = 2
    chunked_prefill: bool = False
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    api_key: str | None = None
    seed: int = 0
    enforce_eager: bool = False
    logprobs_mode: str = "processed_logprobs"
    dev_mode: bool = True
    return_routed_experts: bool = False
    served_model_name: str = "policy"
    startup_timeout_s: float = 600.0
    log_path: str | Path | None = None
    python: str | Path | None = None
    extra_args: Sequence[str] = ()
    extra_env: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {self.logprobs_mode!r}")
        if not isinstance(self.max_model_len, int) or self.max_model_len < 2:
            raise ValueError(f"max_model_len must be an int >= 2, got {self.max_model_len!r}")
        if not isinstance(self.kv_cache_gib, int) or self.kv_cache_gib < 1:
            raise ValueError(f"kv_cache_gib must be an int >= 1 (VLLM_CPU_KVCACHE_SPACE is whole GiB), "
                             f"got {self.kv_cache_gib!r}")
        self._check_batching()
        if not isinstance(self.return_routed_experts, bool):
            raise ValueError(f"return_routed_experts must be True or False, got {self.return_routed_experts!r}")
        if self.return_routed_experts and not self.dev_mode:
            raise ValueError("return_routed_experts=True needs dev_mode=True: the routed experts are fetched "
                             "over /collective_rpc")
        if self.return_routed_experts and not self.enforce_eager:
            raise ValueError("return_routed_experts=True needs enforce_eager=True: vLLM compiles the model before "
                             "the routing hook is installed, and the compiled graph never calls it")
        if self.port is not None and not (0 < self.port < 65536):
            raise ValueError(f"port must be in 1..65535 or None, got {self.port!r}")
        if not is_loopback(self.host) and not self.api_key:
            raise ValueError(
                f"host {self.host!r} is not a loopback address: the server's dev endpoints "
                "(/collective_rpc) let any caller run code on it, so api_key is required. Use "
                "host='127.0.0.1' or pass api_key=...")

    @property
    def token_budget(self) -> int:
        """The --max-num-batched-tokens the server is started with."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return max(self.max_model_len, VLLM_CPU_DEFAULT_BATCHED_TOKENS)

    def _check_batching(self) -> None:
        """The limits vLLM would otherwise only report by failing to start."""
        if not isinstance(self.chunked_prefill, bool):
            raise ValueError(f"chunked_prefill must be True or False, got {self.chunked_prefill!r}")
        seqs = self.max_num_seqs
        if seqs is not None and (not isinstance(seqs, int) or seqs < 1 or seqs > self.token_budget):
            raise ValueError(f"max_num_seqs must be None or an int in 1..{self.token_budget} (the step's token "
                             f"budget, max_num_batched_tokens), got {seqs!r}")
        budget = self.max_num_batched_tokens
        if budget is None:
            return
        if not isinstance(budget, int) or budget < VLLM_CPU_DEFAULT_MAX_NUM_SEQS:
            raise ValueError(f"max_num_batched_tokens must be None or an int >= {VLLM_CPU_DEFAULT_MAX_NUM_SEQS} "
                             f"(vLLM's max_num_seqs on CPU), got {budget!r}")
        if not self.chunked_prefill and budget < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens={budget} is below max_model_len={self.max_model_len}: without "
                "chunked prefill a prompt must fit into one step. Use max_num_batched_tokens >= "
                f"{self.max_model_len}, None, or a smaller max_model_len")


def check_model_limits(config: VLLMServerConfig) -> None:
    """Refuse a max_model_len beyond the model's max_position_embeddings
    before launching (vLLM would fail to start after loading for a minute)."""
    model_config = json.loads((Path(config.model_dir) / "config.json").read_text())
    limit = model_config.get("max_position_embeddings")
    if isinstance(limit, int) and config.max_model_len > limit:
        raise ValueError(f"max_model_len={config.max_model_len} exceeds the model's max_position_embeddings="
                         f"{limit} ({config.model_dir}/config.json); use max_model_len <= {limit}")


MOE_EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def names_experts(model_config: Mapping) -> bool:
    """An HF config.json (as a dict) of a mixture-of-experts model: one of MOE_EXPERT_COUNT_KEYS > 0."""
    return any(isinstance(model_config.get(k), int) and model_config[k] > 0 for k in MOE_EXPERT_COUNT_KEYS)


def is_moe_dir(model_dir: str | os.PathLike) -> bool:
    """The HF directory's config.json names experts (`names_experts`); False without a config.json."""
    path = Path(model_dir) / "config.json"
    return path.is_file() and names_experts(json.loads(path.read_text()))


def check_routing_model(config: VLLMServerConfig) -> None:
    """Refuse return_routed_experts for a model whose config.json names no experts (a dense model
    has no routing to return)."""
    if not config.return_routed_experts:
        return
    model_config = json.loads((Path(config.model_dir) / "config.json").read_text())
    if not names_experts(model_config):
        raise ValueError(f"return_routed_experts=True needs a mixture-of-experts model, but {config.model_dir}/"
                         f"config.json (model_type {model_config.get('model_type')!r}) has none of "
                         f"{MOE_EXPERT_COUNT_KEYS} > 0; use return_routed_experts=False for a dense model")


def server_command(config: VLLMServerConfig, python: Path, port: int) -> list[str]:
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(Path(config.model_dir).resolve()),
        "--served-model-name", config.served_model_name,
        "--host", config.host,
        "--port", str(port),
        "--dtype", config.dtype,
        "--max-model-len", str(config.max_model_len),
        "--logprobs-mode", config.logprobs_mode,
        "--generation-config", "vllm",
        "--seed", str(config.seed),
        "--max-num-batched-tokens", str(config.token_budget),
        "--enable-chunked-prefill" if config.chunked_prefill else "--no-enable-chunked-prefill",
        "--disable-uvicorn-access-log",
    ]
    if config.max_num_seqs is not None:
        cmd += ["--max-num-seqs", str(config.max_num_seqs)]
    if config.enforce_eager:
        cmd.append("--enforce-eager")
    if config.api_key:
        cmd += ["--api-key", config.api_key]
    if config.return_routed_experts or is_moe_dir(config.model_dir):
        cmd += ["--worker-extension-cls", ROUTING_CAPTURE_EXTENSION]
    if config.return_routed_experts:
        cmd.append("--no-enable-prefix-caching")
    return cmd + list(config.extra_args)


def server_env(config: VLLMServerConfig) -> dict[str, str]:
    env = dict(os.environ)
    # The learner's JAX/XLA variables mean nothing to vLLM; its own pins must win.
    for key in ("PYTHONPATH", "VIRTUAL_ENV", "XLA_FLAGS", "JAX_PLATFORMS"):
        env.pop(key, None)
    env.update({
        "VLLM_CPU_KVCACHE_SPACE": str(config.kv_cache_gib),
        "VLLM_SERVER_DEV_MODE": "1" if config.dev_mode else "0",
        **QUIET_OFFLINE_ENV,
    })
    if config.return_routed_experts or is_moe_dir(config.model_dir):
        env["PYTHONPATH"] = str(ROUTING_CAPTURE_DIR)
    env.update(config.extra_env)
    return env


