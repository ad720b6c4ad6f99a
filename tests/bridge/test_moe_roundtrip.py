"""Qwen3-MoE HF directories both ways: transformers' save_pretrained -> load_hf_dir, and
save_hf_dir / write_sync_dir -> transformers' from_pretrained, with per-expert tensor names."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.bridge import SafetensorsFile, load_hf_dir, save_hf_dir
from jaxrl_llm.bridge.hf_save import write_sync_dir
from jaxrl_llm.models import forward, init_params
from tests.models.hf_reference import hf_checkpoint_tensors, hf_logits, hf_model, our_config_and_params, rel_err, \
    transformers

TOKENS = np.random.RandomState(1).randint(0, 97, size=(2, 24))
NAMES = ["qwen3_moe_norm_topk", "mixtral"]


def _per_expert_names(name: str, layers: int = 2, experts: int = 4) -> set[str]:
    """The names vLLM's qwen3_moe.py / mixtral.py load, written out: one tensor per expert and projection."""
    block, projections = ("block_sparse_moe", ("w1", "w2", "w3")) if name == "mixtral" else \
        ("mlp", ("gate_proj", "up_proj", "down_proj"))
    return {f"model.layers.{i}.{block}.experts.{e}.{p}.weight"
            for i in range(layers) for e in range(experts) for p in projections} | \
           {f"model.layers.{i}.{block}.gate.weight" for i in range(layers)}


@pytest.mark.parametrize("name", NAMES)
def test_load_dir_written_by_transformers(tmp_path, name):
    model = hf_model(name)
    model.save_pretrained(tmp_path)  # transformers 5.24 writes the experts per expert
    stored = set(SafetensorsFile(str(tmp_path / "model.safetensors")).names)
    assert _per_expert_names(name) <= stored and not any(n.endswith(("gate_up_proj", "experts.down_proj"))
                                                        for n in stored)
    cfg, params = load_hf_dir(tmp_path)
    _, reference = our_config_and_params(model)
    for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree_util.tree_leaves(reference)):
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=jax.tree_util.keystr(path))
    assert rel_err(forward(params, cfg, jnp.asarray(TOKENS))[0], hf_logits(model, TOKENS)) <= 1e-5


@pytest.mark.parametrize("name, writer", [(NAMES[0], "save_hf_dir"), (NAMES[0], "write_sync_dir"),
                                          (NAMES[1], "save_hf_dir")])
def test_exported_dir_loads_in_transformers_with_equal_logits(tmp_path, name, writer):
    cfg, _ = our_config_and_params(hf_model(name))
    params = init_params(cfg, jax.random.PRNGKey(5))
    params["layers"]["router"] = params["layers"]["router"] * 10  # decisive routing: no near-ties in the top-k
    out = str(tmp_path / "export")
    if writer == "save_hf_dir":
        save_hf_dir(cfg, params, out)
    else:
        write_sync_dir(cfg, params, out)
    names = set(SafetensorsFile(out + "/model.safetensors").names)
    assert _per_expert_names(name) <= names
    assert not [n for n in names if "experts" in n and n not in _per_expert_names(name)]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    assert type(loaded).__name__ == cfg.architecture and loaded.config.num_local_experts == 4
    ours = np.asarray(forward(params, cfg, jnp.asarray(TOKENS))[0])
    assert rel_err(ours, hf_logits(loaded, TOKENS)) <= 1e-5
    # the expert tensors transformers loaded are ours, transposed back to [out, in]
    state = hf_checkpoint_tensors(loaded)
    block, up = ("block_sparse_moe", "w3") if name == "mixtral" else ("mlp", "up_proj")
    np.testing.assert_array_equal(state[f"model.layers.1.{block}.experts.3.{up}.weight"],
                                  np.asarray(params["layers"]["expert_up"][1, 3]).T)
    np.testing.assert_array_equal(state[f"model.layers.0.{block}.gate.weight"],
                                  np.asarray(params["layers"]["router"][0]).T)
    cfg_back, back = load_hf_dir(out)
    assert cfg_back == cfg
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), back, params)
