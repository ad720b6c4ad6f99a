"""Rollout engines behind one interface (`RolloutEngine`).

vLLM side (this package; the server runs in its own environment, see
`vllm_env` and launch/build_vllm_env.sh):

    VLLMServer(VLLMServerConfig(model_dir, dtype=..., ...))   launcher, context manager
    VLLMClient(urls, ...)                                     concurrent HTTP client
    DiskWeightSync(client, bridge_export(cfg), probe=...)     weight sync strategy
    VLLMEngine(client, weight_sync, servers=[...])            RolloutEngine

Shared types: SamplingParams, RolloutRecord, RolloutBatch, RolloutEngine.
The in-process JAX sampler lives in `jax_sampler`.
"""
from jaxrl_llm.rollout.routed_experts import RoutedExpertsError
from jaxrl_llm.rollout.types import RolloutBatch, RolloutEngine, RolloutRecord, SamplingParams
from jaxrl_llm.rollout.vllm_client import (
    CompletionSample,
    PromptTooLongError,
    VLLMClient,
    VLLMClientError,
    VLLMRequestError,
    VLLMResponseError,
    VLLMUnavailableError,
)
from jaxrl_llm.rollout.vllm_engine import UnverifiedWeightsError, VLLMEngine
from jaxrl_llm.rollout.vllm_env import VLLMEnvNotFoundError, vllm_env_dir, vllm_env_is_built, vllm_python
from jaxrl_llm.rollout.vllm_server import PortInUseError, VLLMServer, VLLMServerError
from jaxrl_llm.rollout.vllm_server_config import VLLMServerConfig
from jaxrl_llm.rollout.weight_sync import (
    DiskWeightSync,
    LogprobProbe,
    PendingPush,
    WeightSync,
    WeightSyncError,
    WeightSyncReport,
    bridge_export,
)

__all__ = [
    "RolloutBatch", "RolloutEngine", "RolloutRecord", "SamplingParams", "RoutedExpertsError",
    "CompletionSample", "PromptTooLongError", "VLLMClient", "VLLMClientError", "VLLMRequestError", "VLLMResponseError",
    "VLLMUnavailableError", "UnverifiedWeightsError", "VLLMEngine", "VLLMEnvNotFoundError", "vllm_env_dir",
    "vllm_env_is_built", "vllm_python", "PortInUseError", "VLLMServer", "VLLMServerConfig", "VLLMServerError",
    "DiskWeightSync", "LogprobProbe", "WeightSync", "WeightSyncError", "PendingPush", "WeightSyncReport", "bridge_export",
]
