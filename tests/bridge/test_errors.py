"""Bad checkpoints fail with a CheckpointError that names the tensor, field or file at fault."""
from __future__ import annotations

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.bridge import (CheckpointError, SafetensorsFile, load_gguf, load_hf_dir, save_hf_dir,
                              smollm2_gguf_path, write_safetensors)
from tests.bridge.tiny import state_numpy, tiny_model
from tests.bridge.tiny_gguf import write_gguf

LAYER0_Q = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("good")
    model = tiny_model("qwen2_tied")
    model.save_pretrained(directory)
    return str(directory)


@pytest.fixture
def bad_dir(good_dir, tmp_path):
    """A fresh copy of the good checkpoint to break."""
    return shutil.copytree(good_dir, tmp_path / "ckpt")


def _tensors(directory) -> dict[str, np.ndarray]:
    file = SafetensorsFile(os.path.join(directory, "model.safetensors"))
    return {name: np.array(file.array(name)) for name in file.names}


def _rewrite_weights(directory, tensors) -> None:
    write_safetensors(os.path.join(directory, "model.safetensors"), tensors)


def _edit_config(directory, edit) -> None:
    path = os.path.join(directory, "config.json")
    with open(path) as f:
        config = json.load(f)
    edit(config)
    with open(path, "w") as f:
        json.dump(config, f)


# ---------------------------------------------------------------- tensors
def test_missing_tensor(bad_dir):
    tensors = _tensors(bad_dir)
    del tensors[LAYER0_Q]
    _rewrite_weights(bad_dir, tensors)
    with pytest.raises(CheckpointError, match=r"1 tensor\(s\) missing.*model\.layers\.0\.self_attn\.q_proj\.weight"):
        load_hf_dir(bad_dir)


def test_extra_tensor(bad_dir):
    tensors = _tensors(bad_dir)
    tensors["model.layers.7.mlp.gate_proj.weight"] = np.zeros((96, 64), np.float32)
    _rewrite_weights(bad_dir, tensors)
    with pytest.raises(CheckpointError, match=r"unexpected tensor.*model\.layers\.7\.mlp\.gate_proj\.weight"):
        load_hf_dir(bad_dir)


def test_shape_mismatch(bad_dir):
    tensors = _tensors(bad_dir)
    tensors[LAYER0_Q] = np.zeros((64, 32), np.float32)
    _rewrite_weights(bad_dir, tensors)
    with pytest.raises(CheckpointError, match=r"q_proj\.weight' has shape \[64, 32\].*needs \[64, 64\]"):
        load_hf_dir(bad_dir)


def test_integer_dtype(bad_dir):
    tensors = _tensors(bad_dir)
    tensors["model.norm.weight"] = tensors["model.norm.weight"].astype(np.int32)
    _rewrite_weights(bad_dir, tensors)
    with pytest.raises(CheckpointError, match=r"'model\.norm\.weight' has dtype int32; valid: \["):
        load_hf_dir(bad_dir)


def test_mixed_dtypes_need_explicit_dtype(bad_dir):
    tensors = _tensors(bad_dir)
    tensors["model.norm.weight"] = tensors["model.norm.weight"].astype(np.float16)
    _rewrite_weights(bad_dir, tensors)
    with pytest.raises(CheckpointError, match=r"stored as .*float16.: .model\.norm\.weight.*pass dtype="):
        load_hf_dir(bad_dir)
    cfg, params = load_hf_dir(bad_dir, dtype="float32")  # the documented way out
    np.testing.assert_array_equal(np.asarray(params["final_norm"]), tensors["model.norm.weight"].astype(np.float32))


# ---------------------------------------------------------------- config
def test_unknown_architecture(bad_dir):
    _edit_config(bad_dir, lambda c: c.update(architectures=["GPT2LMHeadModel"], model_type="gpt2"))
    with pytest.raises(CheckpointError, match=r"config\.json.*unsupported architecture 'GPT2LMHeadModel'.*LlamaForCausalLM"):
        load_hf_dir(bad_dir)


def test_config_missing_required_field(bad_dir):
    _edit_config(bad_dir, lambda c: c.pop("hidden_size"))
    with pytest.raises(CheckpointError, match=r"config\.json.*missing required field.*hidden_size"):
        load_hf_dir(bad_dir)


def test_config_not_json(bad_dir):
    with open(os.path.join(bad_dir, "config.json"), "w") as f:
        f.write('{"architectures": ["Qwen2ForCausalLM"], ')
    with pytest.raises(CheckpointError, match=r"config\.json"):
        load_hf_dir(bad_dir)


def test_no_config_or_no_weights(bad_dir, tmp_path):
    os.remove(os.path.join(bad_dir, "config.json"))
    with pytest.raises(CheckpointError, match="no config.json"):
        load_hf_dir(bad_dir)
    with pytest.raises(CheckpointError, match="neither model.safetensors nor model.safetensors.index.json"):
        load_hf_dir(tmp_path)


# ---------------------------------------------------------------- corrupted files
def test_truncated_safetensors(bad_dir):
    path = os.path.join(bad_dir, "model.safetensors")
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 1000)
    with pytest.raises(CheckpointError, match=rf"tensor '.+' ends at byte \d+ but the file has {size - 1000} bytes; "
                                              "the file is truncated"):
        load_hf_dir(bad_dir)


def test_corrupted_safetensors_header(bad_dir):
    path = os.path.join(bad_dir, "model.safetensors")
    with open(path, "r+b") as f:
        f.seek(8)
        f.write(b"\x00garbage\xff")
    with pytest.raises(CheckpointError, match="header is not valid JSON"):
        load_hf_dir(bad_dir)
    with open(path, "r+b") as f:
        f.write((10**12).to_bytes(8, "little"))
    with pytest.raises(CheckpointError, match="header length 1000000000000 exceeds the file size"):
        load_hf_dir(bad_dir)


def test_sharded_index_points_to_missing_shard(bad_dir):
    names = list(_tensors(bad_dir))
    with open(os.path.join(bad_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"weight_map": {name: "model-00002-of-00002.safetensors" for name in names}}, f)
    with pytest.raises(CheckpointError, match=r"shard 'model-00002-of-00002\.safetensors'.*does not exist"):
        load_hf_dir(bad_dir)


def test_truncated_gguf_names_the_tensor(tmp_path):
    path = tmp_path / "cut.gguf"
    with open(smollm2_gguf_path(), "rb") as source, open(path, "wb") as cut:
        cut.write(source.read(50_000_000))
    with pytest.raises(CheckpointError, match=r"tensor 'blk\.\d+\.\w+\.weight' ends at byte \d+ but the file has "
                                              r"50000000 bytes; the file is truncated"):
        load_gguf(path)


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"NOPE" + bytes(100))
    with pytest.raises(CheckpointError, match=r"junk\.gguf: not a readable GGUF file .*magic"):
        load_gguf(path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_gguf(tmp_path / "absent.gguf")


@pytest.fixture(scope="module")
def tiny_state():
    model = tiny_model("qwen2_tied")
    state = {k: v for k, v in state_numpy(model).items() if k != "lm_head.weight"}
    return {**model.config.to_dict(), "head_dim": 16}, state


def test_gguf_unknown_architecture(tmp_path, tiny_state):
    config, state = tiny_state
    write_gguf(tmp_path / "m.gguf", config, state, arch="gpt2")
    with pytest.raises(CheckpointError, match=r"general\.architecture='gpt2' is not supported; valid: \['llama', 'qwen2', 'qwen3'\]"):
        load_gguf(tmp_path / "m.gguf")


def test_gguf_missing_field(tmp_path, tiny_state):
    config, state = tiny_state
    write_gguf(tmp_path / "m.gguf", config, state, arch="qwen2", skip_fields=("block_count",))
    with pytest.raises(CheckpointError, match=r"GGUF metadata field 'qwen2\.block_count' is missing"):
        load_gguf(tmp_path / "m.gguf")


def test_gguf_missing_tensor(tmp_path, tiny_state):
    config, state = tiny_state
    state = {k: v for k, v in state.items() if k != "model.layers.1.mlp.up_proj.weight"}
    write_gguf(tmp_path / "m.gguf", config, state, arch="qwen2")
    with pytest.raises(CheckpointError, match=r"missing.*model\.layers\.1\.mlp\.up_proj\.weight"):
        load_gguf(tmp_path / "m.gguf")


def test_gguf_unsupported_tokenizer(tmp_path, tiny_state):
    config, state = tiny_state
    write_gguf(tmp_path / "m.gguf", config, state, arch="qwen2", tokenizer_model="llama")
    with pytest.raises(CheckpointError, match=r"tokenizer\.ggml\.model='llama' is not supported; valid: 'gpt2'"):
        load_gguf(tmp_path / "m.gguf")


# ---------------------------------------------------------------- saving
def test_save_rejects_params_that_do_not_fit_the_config(good_dir, tmp_path):
    cfg, params = load_hf_dir(good_dir)
    missing = {**params, "layers": {k: v for k, v in params["layers"].items() if k != "q_bias"}}
    with pytest.raises(CheckpointError, match=r"missing \['layers/q_bias'\]"):
        save_hf_dir(cfg, missing, tmp_path / "out")
    wrong = {**params, "final_norm": jnp.zeros((3,))}
    with pytest.raises(CheckpointError, match=r"params\['final_norm'\] has shape \[3\].*needs \[64\]"):
        save_hf_dir(cfg, wrong, tmp_path / "out")
    with pytest.raises(ValueError, match=r"dtype='float64' is not supported|dtype='float64'"):
        save_hf_dir(cfg, params, tmp_path / "out", dtype="float64")
    assert not os.path.exists(tmp_path / "out") and os.listdir(tmp_path) == []
