"""Policy model family: Llama / Qwen2 / Qwen3 / Qwen3-MoE decoders in Flax, per-token
logprobs (chunked, float32 softmax), dtype policy and sharding rules.

The params layout is documented in ``decoder.py``; the HF name map in ``hf_names.py``.
"""
from jaxrl_llm.models.config import SUPPORTED_ARCHITECTURES, DecoderConfig, RopeScaling, canonical_dtype_name
from jaxrl_llm.models.decoder import (
    Decoder,
    forward,
    init_cache,
    init_params,
    lm_head_logits,
    param_shapes,
    positions_from_segments,
)
from jaxrl_llm.models.hf_names import hf_tensor_names, params_from_hf, params_to_hf
from jaxrl_llm.models.moe import RoutedForward, Routing
from jaxrl_llm.models.router_losses import (RouterMetrics, load_balancing_loss, router_metrics,
                                            router_z_loss)
from jaxrl_llm.models.logprobs import chunked_logprobs_from_hidden, logprobs_from_logits, token_logprobs
from jaxrl_llm.models.sharding import (
    MESH_AXES,
    batch_sharding,
    cache_shardings,
    make_mesh,
    param_partition_specs,
    param_shardings,
)

__all__ = [
    "SUPPORTED_ARCHITECTURES", "DecoderConfig", "RopeScaling", "canonical_dtype_name",
    "Decoder", "forward", "init_cache", "init_params", "lm_head_logits", "param_shapes", "positions_from_segments",
    "hf_tensor_names", "params_from_hf", "params_to_hf",
    "RoutedForward", "Routing", "RouterMetrics", "load_balancing_loss", "router_metrics", "router_z_loss",
    "chunked_logprobs_from_hidden", "logprobs_from_logits", "token_logprobs",
    "MESH_AXES", "batch_sharding", "cache_shardings", "make_mesh", "param_partition_specs", "param_shardings",
]
