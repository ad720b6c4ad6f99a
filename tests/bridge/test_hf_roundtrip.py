"""HF directory <-> params on tiny random Llama / Qwen2 / Qwen3 models, against transformers."""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.bridge import SafetensorsFile, load_hf_dir, save_hf_dir
from jaxrl_llm.models import forward, params_to_hf
from tests.bridge.tiny import FAMILIES, rel_err, state_numpy, tiny_model, tokens, torch_logits, torch, transformers


def _logits(cfg, params, toks):
    return np.asarray(forward(params, cfg, jnp.asarray(toks))[0])


def _assert_trees_equal(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def hf_dir(request, tmp_path_factory):
    """(transformers model, directory it wrote with save_pretrained): an independent writer."""
    model = tiny_model(request.param)
    directory = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(directory)
    return model, str(directory)


def test_load_dir_written_by_transformers(hf_dir):
    model, directory = hf_dir
    cfg, params = load_hf_dir(directory)
    reference = state_numpy(model)
    ours = params_to_hf(jax.tree_util.tree_map(np.asarray, params), cfg)
    for name, array in ours.items():
        np.testing.assert_array_equal(array, reference[name], err_msg=name)
    toks = tokens()
    assert rel_err(_logits(cfg, params, toks), torch_logits(model, toks)) < 1e-5


def test_save_then_load_is_exact_and_transformers_gets_identical_logits(hf_dir, tmp_path):
    model, directory = hf_dir
    cfg, params = load_hf_dir(directory)
    out = save_hf_dir(cfg, params, tmp_path / "export", dtype="float32", tokenizer_dir=None)
    cfg2, params2 = load_hf_dir(out)
    assert cfg2 == cfg
    _assert_trees_equal(params, params2)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    assert type(reloaded) is type(model)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(reloaded.state_dict()[name], tensor, rtol=0, atol=0, msg=name)
    toks = tokens(seed=1)
    np.testing.assert_array_equal(torch_logits(reloaded, toks), torch_logits(model, toks))


@pytest.mark.parametrize("dtype, torch_dtype, code", [("bfloat16", "bfloat16", "BF16"), ("float16", "float16", "F16")])
def test_low_precision_export_rounds_like_torch(hf_dir, tmp_path, dtype, torch_dtype, code):
    model, directory = hf_dir
    cfg, params = load_hf_dir(directory)
    out = save_hf_dir(cfg, params, tmp_path / "export", dtype=dtype)
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["torch_dtype"] == dtype
    stored = SafetensorsFile(os.path.join(out, "model.safetensors"))
    assert {stored.dtype(n).name for n in stored.names} == {dtype}
    # Reference rounding: torch's float32 -> bf16/fp16 cast of the original weights.
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=getattr(torch, torch_dtype))
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(reloaded.state_dict()[name], tensor.to(getattr(torch, torch_dtype)),
                                   rtol=0, atol=0, msg=name)
    cfg_low, params_low = load_hf_dir(out)
    assert cfg_low.param_dtype == dtype
    assert {x.dtype.name for x in jax.tree_util.tree_leaves(params_low)} == {dtype}


def test_load_with_dtype_converts_every_leaf(hf_dir):
    _, directory = hf_dir
    cfg, params = load_hf_dir(directory)
    cfg16, params16 = load_hf_dir(directory, dtype="bf16")
    assert cfg16.param_dtype == "bfloat16" and cfg16 == cfg.with_dtypes(param_dtype="bfloat16")
    expected = jax.tree_util.tree_map(lambda x: np.asarray(x).astype(jnp.bfloat16), params)
    _assert_trees_equal(expected, params16)


def test_sharded_export_with_index(hf_dir, tmp_path):
    model, directory = hf_dir
    cfg, params = load_hf_dir(directory)
    out = save_hf_dir(cfg, params, tmp_path / "export", max_shard_bytes=60_000)
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    shards = sorted(set(weight_map.values()))
    assert len(shards) > 2 and sorted(n for n in os.listdir(out) if n.endswith(".safetensors")) == shards
    assert not os.path.exists(os.path.join(out, "model.safetensors"))
    for shard in shards:  # each shard respects the limit unless it holds a single bigger tensor
        names = [n for n, s in weight_map.items() if s == shard]
        assert os.path.getsize(os.path.join(out, shard)) <= 60_000 + 4096 or len(names) == 1
    _assert_trees_equal(params, load_hf_dir(out)[1])
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    toks = tokens(seed=2)
    np.testing.assert_array_equal(torch_logits(reloaded, toks), torch_logits(model, toks))


def test_generation_config_holds_only_token_ids(hf_dir, tmp_path):
    _, directory = hf_dir
    cfg, params = load_hf_dir(directory)
    out = save_hf_dir(cfg, params, tmp_path / "export")
    with open(os.path.join(out, "generation_config.json")) as f:
        assert json.load(f) == {"bos_token_id": 1, "eos_token_id": 2}  # no sampling defaults for vLLM to apply
