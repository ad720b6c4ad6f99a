"""Runs INSIDE a vLLM server's worker process: a weight reload that leaves a Qwen3-MoE on vLLM's
CPU experts kernel correct.

vLLM 0.32's CPU experts (`CPUUnquantizedExperts`) prepack w13 / w2 into the layout of their
grouped GEMM once, after the first load (`process_weights_after_loading`, same shape, other
element order). A later `reload_weights` copies the new checkpoint-format weights into those same
tensors but, treating it as a weight update, does not prepack again (unquantized_fused_moe_method,
`is_weight_update`): the kernel then reads unpacked weights as packed ones. Measured on a tiny
Qwen3-MoE (fp32): reloading the very weights it served moved prompt logprobs by up to 5.8.
`reload_and_repack` reloads and then prepacks every such layer once, in place (the kernel keeps
its tensors); layers on other kernels (GPU, zentorch) are left as the reload made them.

Imports only torch and vLLM (the server's environment has no jaxrl_llm).
"""
from __future__ import annotations


def cpu_prepacked_layers(model) -> list:
    """(layer, experts) of every MoE layer whose experts kernel prepacks its weights on CPU."""
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a build without CPU experts: nothing is prepacked
        return []
    found = []
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if isinstance(experts, CPUUnquantizedExperts) and not getattr(experts, "_use_zentorch", False):
            found.append((module, experts))
    return found


def reload_and_repack(runner, weights_path: str) -> dict:
    """`runner.reload_weights(weights_path=...)` (checkpoint format), then each CPU-prepacked MoE
    layer's w13 and w2 prepacked again in place. Returns {"repacked_layers": count}."""
    import torch
    from vllm import _custom_ops as ops

    runner.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
    layers = cpu_prepacked_layers(runner.get_model())
    with torch.no_grad():
        for layer, experts in layers:
            for name in ("w13_weight", "w2_weight"):
                weight = getattr(layer, name)
                weight.data.copy_(ops.cpu_prepack_moe_weight(weight.data, experts.isa))
    return {"repacked_layers": len(layers)}


class MoEReloadExtension:
    """Methods added to vLLM's worker class (callable with /collective_rpc)."""

    def jaxrl_reload_weights(self, weights_path: str) -> dict:
        return reload_and_repack(self.model_runner, str(weights_path))
