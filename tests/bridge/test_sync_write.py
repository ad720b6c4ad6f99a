"""The weight-sync writer (write_sync_dir): HF tensors as transformers holds them, rewritten in place."""
from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

from jaxrl_llm.bridge import load_hf_dir, save_hf_dir
from jaxrl_llm.bridge.hf_save import write_sync_dir
from tests.bridge.tiny import state_numpy, tiny_model


def _loaded(family: str, seed: int, tmp_path):
    model = tiny_model(family, seed)
    directory = tmp_path / f"{family}-{seed}"
    model.save_pretrained(directory)
    cfg, params = load_hf_dir(str(directory))
    return model, cfg, params


def test_sync_copy_holds_transformers_tensors_and_overwrites_an_older_copy_in_place(tmp_path):
    from safetensors.numpy import load_file  # the reference reader

    family = "llama_untied_attention_bias"  # every tensor kind the writer maps (biases, untied head)
    old_model, old_cfg, old_params = _loaded(family, 1, tmp_path)
    model, cfg, params = _loaded(family, 2, tmp_path)
    target = tmp_path / "sync"
    write_sync_dir(old_cfg, old_params, target, workers=3)
    inode = os.stat(target / "model.safetensors").st_ino
    write_sync_dir(cfg, params, target, workers=3)

    assert os.stat(target / "model.safetensors").st_ino == inode  # rewritten in place, not a new file
    stored = load_file(str(target / "model.safetensors"))
    reference = {name: value for name, value in state_numpy(model).items()
                 if not (cfg.tie_word_embeddings and name == "lm_head.weight")}
    assert sorted(stored) == sorted(reference)
    for name, value in reference.items():
        np.testing.assert_array_equal(stored[name], value, err_msg=name)
    # The same bytes as the checkpoint writer's file (which the vLLM reload tests cover).
    checkpoint = save_hf_dir(cfg, params, tmp_path / "checkpoint", fsync=False)
    assert (target / "model.safetensors").read_bytes() == (tmp_path / checkpoint / "model.safetensors").read_bytes()


def test_sync_copy_replaces_a_larger_file_and_stale_shards(tmp_path):
    _, big_cfg, big_params = _loaded("llama_untied_attention_bias", 1, tmp_path)
    model, cfg, params = _loaded("qwen2_tied", 1, tmp_path)
    target = tmp_path / "sync"
    save_hf_dir(big_cfg, big_params, target, fsync=False, max_shard_bytes=20_000)  # shards + index
    write_sync_dir(big_cfg, big_params, target)
    big_size = os.path.getsize(target / "model.safetensors")
    write_sync_dir(cfg, params, target, dtype="bfloat16")

    assert sorted(p.name for p in target.iterdir()) == ["config.json", "generation_config.json", "model.safetensors"]
    assert os.path.getsize(target / "model.safetensors") < big_size
    _, loaded = load_hf_dir(str(target))
    expected = state_numpy(model)["model.layers.1.mlp.down_proj.weight"].T
    np.testing.assert_array_equal(np.asarray(loaded["layers"]["down_proj"][1]),
                                  expected.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_sync_writer_rejects_bad_arguments(tmp_path):
    _, cfg, params = _loaded("qwen2_tied", 1, tmp_path)
    with pytest.raises(ValueError, match=r"workers=0 must be an int >= 1"):
        write_sync_dir(cfg, params, tmp_path / "x", workers=0)
    with pytest.raises(ValueError, match=r"dtype='int8'"):
        write_sync_dir(cfg, params, tmp_path / "x", dtype="int8")


def test_in_place_writer_lays_out_strided_views_in_c_order_and_keeps_the_file(tmp_path):
    from safetensors.numpy import load_file  # the reference reader (float32 / int tensors)

    from jaxrl_llm.bridge.safetensors_io import SafetensorsFile, write_safetensors_in_place

    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 5, 7)).astype(np.float32)
    h = rng.standard_normal((4, 6)).astype(ml_dtypes.bfloat16)
    arrays = {"w1.T": w[1].T, "stack.T": w.swapaxes(-1, -2), "h.T": h.T, "empty": np.zeros((0, 3), np.float32),
              "ids": np.arange(5, dtype=np.int64)[::2]}  # views: transposed, stacked, bfloat16, strided
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"x" * 10_000)  # an older, larger copy
    inode = os.stat(path).st_ino
    specs = [(name, a.dtype, a.shape) for name, a in arrays.items()]
    size = write_safetensors_in_place(path, specs, arrays.values(), workers=2)

    assert os.stat(path).st_ino == inode and os.path.getsize(path) == size  # same file, cut to the new size
    stored = SafetensorsFile(path)
    for name, a in arrays.items():
        np.testing.assert_array_equal(stored.array(name).view(np.uint8), np.ascontiguousarray(a).view(np.uint8),
                                      err_msg=name)
    f32 = tmp_path / "f32.safetensors"  # for the reference reader: safetensors.numpy has no bfloat16
    write_safetensors_in_place(f32, [(n, a.dtype, a.shape) for n, a in arrays.items() if n != "h.T"],
                               [a for n, a in arrays.items() if n != "h.T"])
    reference = load_file(str(f32))
    np.testing.assert_array_equal(reference["stack.T"], np.ascontiguousarray(w.swapaxes(-1, -2)))
    np.testing.assert_array_equal(reference["ids"], [0, 2, 4])
