"""The rollout engine a config asks for (JAX sampler in process, or vLLM servers), and
what goes to it: sampling parameters and the weights in the dtype it serves.

With LoRA the engines get merged weights W + alpha/r * A @ B (`Learner.full_params`),
so both serve a plain model. vLLM's own LoRA requests are not used: they need a server
started with --enable-lora and a PEFT-format adapter directory per version, and vLLM's
CPU LoRA kernels are slow, while the merged reload is the same path as full fine-tuning.
"""
from __future__ import annotations

import contextlib
import logging
import os

import jax
import jax.numpy as jnp

from jaxrl_llm.rollout.types import SamplingParams
from jaxrl_llm.train.config import Config
from jaxrl_llm.train.config import PRECISION_DTYPES
from jaxrl_llm.train.policy import Policy

log = logging.getLogger(__name__)


def sampling_params(cfg: Config, seed: int, *, max_tokens: int | None = None) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          max_tokens=max_tokens or r.max_tokens, seed=int(seed))


def sampler_dtype(cfg: Config) -> str:
    """The JAX sampler's dtype: model.compute_dtype, else the learner's precision."""
    return cfg.model.compute_dtype or PRECISION_DTYPES[cfg.train.precision]


def cast_params(params, dtype: str):
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.dtype(dtype)), params)


def engine_params(cfg: Config, params):
    """`params` as the configured engine takes them: the JAX sampler in its own dtype; the
    vLLM weight sync converts to the server dtype itself."""
    return params if cfg.rollout.engine == "vllm" else cast_params(params, sampler_dtype(cfg))


def engine_weights(cfg: Config, learner, params):
    """The learner's `params` as the configured rollout engine takes them: the full weights (LoRA
    merged, `Learner.full_params`), a whole host copy with several processes, in the engine's dtype."""
    return engine_params(cfg, host_params(learner.full_params(params)))


def host_params(params):
    """`params` for this process's rollout engine: unchanged with one JAX process; with
    several, a full host copy on every process (the learner's arrays span all of them)."""
    if jax.process_count() == 1:
        return params
    from jaxrl_llm.train.distributed import gather_to_host

    return gather_to_host(params)


def check_server_urls(cfg: Config) -> None:
    """ConfigError naming rollout.server_urls when a vLLM server there does not answer /health."""
    urls = list(cfg.rollout.server_urls)
    if cfg.rollout.engine != "vllm" or not urls:
        return
    from jaxrl_llm.rollout import VLLMClient
    from jaxrl_llm.train.config import ConfigError

    with VLLMClient(urls) as client:
        down = [url for url, ok in zip(client.urls, client.health()) if not ok]
    if down:
        raise ConfigError(f"rollout.server_urls: {', '.join(down)} does not answer GET /health (nothing listening, or "
                          "not a vLLM server); valid: URLs of running vLLM servers (python -m "
                          "jaxrl_llm.rollout.vllm_server), or leave rollout.server_urls empty to start one")


def make_engine(cfg: Config, policy: Policy, params, *, initial_version: int = 0, stack: contextlib.ExitStack):
    """The configured rollout engine serving `params`; servers it starts are stopped by `stack`."""
    if cfg.rollout.engine == "jax":
        from jaxrl_llm.rollout.jax_sampler import JaxSampler

        dtype = sampler_dtype(cfg)
        log.info("rollout engine: JAX sampler (%s)", dtype)
        return JaxSampler(policy.cfg.with_dtypes(param_dtype=dtype, compute_dtype=dtype), cast_params(params, dtype),
                          eos_token_ids=policy.eos_token_ids, pad_id=policy.pad_id, initial_version=initial_version,
                          batch_invariant=cfg.rollout.batch_invariant, decode=cfg.rollout.decode,
                          decode_slots=cfg.rollout.decode_slots, decode_kernel=cfg.rollout.decode_kernel)
    from jaxrl_llm.rollout import (DiskWeightSync, VLLMClient, VLLMEngine, VLLMServer, VLLMServerConfig,
                                   bridge_export)
    from jaxrl_llm.train.sample.weight_check import logprob_probe

    urls = list(cfg.rollout.server_urls)
    servers = []
    if not urls:
        log_path = os.path.join(cfg.run_path, "vllm_server.log")
        log.info("rollout engine: starting a vLLM server (%s) on 127.0.0.1, log %s", cfg.rollout.server_dtype,
                 log_path)
        server = stack.enter_context(VLLMServer(VLLMServerConfig(
            model_dir=policy.model_dir, dtype=cfg.rollout.server_dtype, seed=cfg.seed, log_path=log_path)))
        servers.append(server)
        urls = [server.url]
    client = VLLMClient(urls)
    # Every push is verified: one prompt-logprobs request per server (train/sample/weight_check.py).
    sync = DiskWeightSync(client, bridge_export(policy.cfg), probe=logprob_probe(policy, cfg.rollout.server_dtype))
    engine = stack.enter_context(VLLMEngine(client, sync, servers=servers, initial_version=0,
                                            overlap_verify=cfg.rollout.overlap_verify))
    if initial_version:  # resumed: the servers hold the base weights
        engine.update_weights(params)
        engine.wait_verified()
    return engine
