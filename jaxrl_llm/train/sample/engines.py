"""The rollout engine a config asks for (JAX sampler in process, or vLLM servers), and
what goes to it: sampling parameters and the weights in the dtype it serves.

With LoRA the engines get merged weights W + alpha/r * A @ B (`Learner.full_params`),
so both serve a plain model. vLLM's own LoRA requests are not used: they need a server
started with --enable-lora and a PEFT-format adapter directory per version, and vLLM's
CPU LoRA kernels are slow, while the merged reload is the same path as full fine-tuning.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os

import jax
import jax.numpy as jnp

from jaxrl_llm.rollout.types import SamplingParams
from jaxrl_llm.train.config import Config, ModelConfig, RolloutConfig
from jaxrl_llm.train.config import PRECISION_DTYPES
from jaxrl_llm.train.config.checks import check_policy_fields
from jaxrl_llm.train.policy import Policy

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """What a run's rollout engine is made from (`engine_spec`): the rollout section, the JAX
    sampler's dtype, the seed a vLLM server started here takes, and the run directory (its log)."""

    rollout: RolloutConfig
    dtype: str  # the JAX sampler's (`sampler_dtype`); vLLM converts to rollout.server_dtype itself
    seed: int
    run_path: str


def engine_spec(cfg: Config) -> EngineSpec:
    """The rollout engine of the config: read once where a run is set up."""
    return EngineSpec(cfg.rollout, sampler_dtype(cfg.model, cfg.train.precision), cfg.seed, os.fspath(cfg.run_path))


def sampling_params(rollout: RolloutConfig, seed: int, *, max_tokens: int | None = None) -> SamplingParams:
    """The rollout section's sampling parameters with `seed` (and `max_tokens`, default rollout.max_tokens)."""
    return SamplingParams(temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k,
                          max_tokens=max_tokens or rollout.max_tokens, seed=int(seed))


def sampler_dtype(model: ModelConfig, precision: str) -> str:
    """The JAX sampler's dtype: model.compute_dtype, else the learner's precision (train.precision)."""
    return model.compute_dtype or PRECISION_DTYPES[precision]


def cast_params(params, dtype: str):
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.dtype(dtype)), params)


def engine_params(spec: EngineSpec, params):
    """`params` as the engine of `spec` takes them: the JAX sampler in its own dtype; the
    vLLM weight sync converts to the server dtype itself."""
    return params if spec.rollout.engine == "vllm" else cast_params(params, spec.dtype)


def engine_weights(spec: EngineSpec, learner, params):
    """The learner's `params` as the engine of `spec` takes them: the full weights (LoRA
    merged, `Learner.full_params`), a whole host copy with several processes, in the engine's dtype."""
    return engine_params(spec, host_params(learner.full_params(params)))


def host_params(params):
    """`params` for this process's rollout engine: unchanged with one JAX process; with
    several, a full host copy on every process (the learner's arrays span all of them)."""
    if jax.process_count() == 1:
        return params
    from jaxrl_llm.train.distributed import gather_to_host

    return gather_to_host(params)


def check_server_urls(rollout: RolloutConfig) -> None:
    """ConfigError naming rollout.server_urls when a vLLM server there does not answer /health."""
    urls = list(rollout.server_urls)
    if rollout.engine != "vllm" or not urls:
        return
    from jaxrl_llm.rollout import VLLMClient
    from jaxrl_llm.train.config import ConfigError

    with VLLMClient(urls) as client:
        down = [url for url, ok in zip(client.urls, client.health()) if not ok]
    if down:
        raise ConfigError(f"rollout.server_urls: {', '.join(down)} does not answer GET /health (nothing listening, or "
                          "not a vLLM server); valid: URLs of running vLLM servers (python -m "
                          "jaxrl_llm.rollout.vllm_server), or leave rollout.server_urls empty to start one")


def make_engine(spec: EngineSpec, policy: Policy, params, *, initial_version: int = 0, stack: contextlib.ExitStack):
    """The rollout engine of `spec` serving `params`; servers it starts are stopped by `stack`."""
    rollout = spec.rollout
    check_policy_fields(policy.cfg, rollout=rollout)  # e.g. routing records of a dense policy: ConfigError
    if rollout.engine == "jax":
        from jaxrl_llm.rollout.jax_sampler import JaxSampler
        from jaxrl_llm.train.distributed import rollout_mesh

        log.info("rollout engine: JAX sampler (%s)", spec.dtype)
        return JaxSampler(policy.cfg.with_dtypes(param_dtype=spec.dtype, compute_dtype=spec.dtype),
                          cast_params(params, spec.dtype), eos_token_ids=policy.eos_token_ids, pad_id=policy.pad_id,
                          initial_version=initial_version, batch_invariant=rollout.batch_invariant,
                          decode=rollout.decode, decode_slots=rollout.decode_slots, decode_kernel=rollout.decode_kernel,
                          return_routed_experts=rollout.return_routed_experts, mesh=rollout_mesh(rollout.mesh))
    from jaxrl_llm.rollout import (DiskWeightSync, VLLMClient, VLLMEngine, VLLMServer, VLLMServerConfig,
                                   bridge_export)
    from jaxrl_llm.train.sample.weight_check import logprob_probe

    urls = list(rollout.server_urls)
    servers = []
    if not urls:
        log_path = os.path.join(spec.run_path, "vllm_server.log")
        log.info("rollout engine: starting a vLLM server (%s) on 127.0.0.1, log %s", rollout.server_dtype, log_path)
        server = stack.enter_context(VLLMServer(VLLMServerConfig(
            model_dir=policy.model_dir, dtype=rollout.server_dtype, seed=spec.seed, log_path=log_path,
            # routing capture needs the eager model (VLLMServerConfig.return_routed_experts)
            return_routed_experts=rollout.return_routed_experts, enforce_eager=rollout.return_routed_experts)))
        servers.append(server)
        urls = [server.url]
    client = VLLMClient(urls, return_routed_experts=rollout.return_routed_experts)
    # Every push is verified: one prompt-logprobs request per server (train/sample/weight_check.py).
    sync = DiskWeightSync(client, bridge_export(policy.cfg), probe=logprob_probe(policy, rollout.server_dtype))
    engine = stack.enter_context(VLLMEngine(client, sync, servers=servers, initial_version=0,
                                            overlap_verify=rollout.overlap_verify))
    if initial_version:  # resumed: the servers hold the base weights
        engine.update_weights(params)
        engine.wait_verified()
    return engine
