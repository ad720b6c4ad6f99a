"""load_hf_dir onto an (fsdp=4, tensor=2) mesh of 8 fake CPU devices: same values, each
device shard read directly from disk (never the whole tensor)."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxrl_llm.bridge import hf_load, load_hf_dir
from jaxrl_llm.models import make_mesh, param_shapes, param_shardings
from tests.bridge.tiny import tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("qwen3")
    tiny_model("qwen3_qk_norm").save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def mesh():
    if jax.device_count() != 8:
        pytest.skip("needs the 8 fake CPU devices tests/conftest.py sets up")
    return make_mesh(fsdp=4, tensor=2)


def _spy_reads(monkeypatch) -> dict[int, list[tuple[int, ...]]]:
    """Record the shape of every slice the loader's callbacks read, per leaf reader."""
    reads: dict[int, list] = {}
    original = hf_load._leaf_reader

    def spying_reader(files, leaf, dtype):
        read = original(files, leaf, dtype)
        log = reads.setdefault(len(reads), [])

        def recorded(index):
            out = read(index)
            log.append(out.shape)
            return out
        return recorded

    monkeypatch.setattr(hf_load, "_leaf_reader", spying_reader)
    return reads


def test_sharded_load_equals_single_device(tiny_dir, mesh):
    cfg, single = load_hf_dir(tiny_dir)
    cfg_sharded, sharded = load_hf_dir(tiny_dir, mesh=mesh)
    assert cfg_sharded == cfg
    expected_shardings = param_shardings(param_shapes(cfg), mesh)
    for path, leaf in jax.tree_util.tree_leaves_with_path(sharded):
        want = _at(expected_shardings, path)
        assert leaf.sharding.is_equivalent_to(want, leaf.ndim), jax.tree_util.keystr(path)
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(_at(single, path)))
    q_proj = sharded["layers"]["q_proj"]  # [nL, D, Hq*hd] split 4 x 2: really distributed
    assert q_proj.addressable_shards[0].data.shape == (2, 16, 32)
    assert len({s.device for s in q_proj.addressable_shards}) == 8


def test_each_device_reads_only_its_shard(tiny_dir, mesh, monkeypatch):
    reads = _spy_reads(monkeypatch)
    cfg, params = load_hf_dir(tiny_dir, mesh=mesh)
    leaves = [leaf for _, leaf in sorted(_flat(params).items(), key=lambda kv: _order(cfg).index(kv[0]))]
    assert len(reads) == len(leaves)
    for (_, shapes), leaf in zip(sorted(reads.items()), leaves):
        shard_shape = leaf.sharding.shard_shape(leaf.shape)
        assert shapes and set(shapes) == {shard_shape}
    split = [leaf for leaf in leaves if leaf.sharding.shard_shape(leaf.shape) != leaf.shape]
    assert len(split) >= 8  # embed, lm_head, q/k/v/o, gate/up/down are split


def test_explicit_shardings_argument(tiny_dir, mesh):
    cfg, _ = load_hf_dir(tiny_dir)
    replicated = jax.tree_util.tree_map(lambda _: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()),
                                        param_shapes(cfg))
    _, params = load_hf_dir(tiny_dir, shardings=replicated)
    assert all(leaf.sharding.is_fully_replicated for leaf in jax.tree_util.tree_leaves(params))


def _at(tree, path):
    for key in path:
        tree = tree[key.key]
    return tree


def _flat(params):
    out = {k: v for k, v in params.items() if k != "layers"}
    out.update({f"layers/{k}": v for k, v in params["layers"].items()})
    return out


def _order(cfg):
    return list(hf_load.hf_layout(cfg))


def test_save_from_sharded_params_equals_single_device(tiny_dir, mesh, tmp_path):
    from jaxrl_llm.bridge import save_hf_dir
    from jaxrl_llm.bridge.safetensors_io import SafetensorsFile
    cfg, single = load_hf_dir(tiny_dir)
    _, sharded = load_hf_dir(tiny_dir, mesh=mesh)
    out_single = SafetensorsFile(save_hf_dir(cfg, single, tmp_path / "single") + "/model.safetensors")
    out_sharded = SafetensorsFile(save_hf_dir(cfg, sharded, tmp_path / "sharded", dtype="bf16") + "/model.safetensors")
    assert sorted(out_single.names) == sorted(out_sharded.names)
    for name in out_single.names:  # bf16 export of sharded params = bf16 rounding of the f32 export
        np.testing.assert_array_equal(out_sharded.array(name), out_single.array(name).astype(out_sharded.dtype(name)))
