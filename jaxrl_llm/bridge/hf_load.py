"""HF safetensors checkpoint directory -> (DecoderConfig, params), optionally sharded.

Each params leaf is built with ``jax.make_array_from_callback``: for every
device shard the callback reads exactly that slice from the memory-mapped
safetensors file(s) (per layer, transposed as a view), so a model larger than
one device's memory loads straight into its NamedShardings. The HF <-> params
name map is ``jaxrl_llm.models.hf_names``.
"""
from __future__ import annotations

import os
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh, SingleDeviceSharding

from jaxrl_llm.bridge.errors import CheckpointError
from jaxrl_llm.bridge.safetensors_io import SafetensorsDir
from jaxrl_llm.models import hf_names
from jaxrl_llm.models.config import DecoderConfig, canonical_dtype_name
from jaxrl_llm.models.decoder import jnp_dtype, param_shapes
from jaxrl_llm.models.sharding import param_shardings

_FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")
# Names a checkpoint may carry that are recomputed, never loaded.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def read_hf_config(directory: str | os.PathLike, *, param_dtype: Any = "float32") -> DecoderConfig:
    """DecoderConfig from ``directory/config.json``; problems become CheckpointErrors naming the file."""
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise CheckpointError(f"{directory}: no config.json (an HF checkpoint directory needs one)")
    try:
        return DecoderConfig.from_hf(path, param_dtype=param_dtype)
    except ValueError as err:  # json.JSONDecodeError is a ValueError too
        raise CheckpointError(f"{path}: {err}") from err


def hf_layout(cfg: DecoderConfig) -> dict[str, hf_names.LeafNames]:
    """params path ('embed', 'layers/q_proj', ...) -> LeafNames (our shape, the HF names row-major
    over the stacked leading axes: layers, and experts for a MoE's expert leaves; transposed?)."""
    return hf_names.leaf_names(cfg)


def _hf_shape(shape: tuple[int, ...], transposed: bool) -> tuple[int, ...]:
    return tuple(reversed(shape)) if transposed else shape


def check_tensors(files: SafetensorsDir, cfg: DecoderConfig) -> dict[str, str]:
    """Names, shapes and dtypes of every tensor against ``cfg``; returns {stored dtype: an example tensor}.

    Raises CheckpointError naming the first bad tensors: missing, unexpected (a tied
    model's ``lm_head.weight`` copy is tolerated), wrong shape, non-float dtype.
    """
    where = files.directory
    expected = set(hf_names.hf_tensor_names(cfg))
    present = set(files.names)
    missing = sorted(expected - present)
    if missing:
        raise CheckpointError(f"{where}: {len(missing)} tensor(s) missing for {cfg.architecture} "
                              f"({cfg.num_layers} layers): {missing[:8]}")
    tolerated = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    unexpected = sorted(n for n in present - expected - tolerated if not n.endswith(_IGNORED_SUFFIXES))
    if unexpected:
        raise CheckpointError(f"{where}: {len(unexpected)} unexpected tensor(s) for {cfg.architecture} "
                              f"({cfg.num_layers} layers): {unexpected[:8]}")
    dtypes = {}
    for path, (shape, names, stacked, transposed) in hf_layout(cfg).items():
        per_tensor = shape[stacked:]
        for name in names:
            want, got = _hf_shape(per_tensor, transposed), files.file(name).shape(name)
            if got != want:
                raise CheckpointError(f"{files.file(name).path}: tensor {name!r} has shape {list(got)}, "
                                      f"config {cfg.architecture} needs {list(want)} (params {path})")
            dtype = files.file(name).dtype(name)
            if dtype.name not in _FLOAT_DTYPES:
                raise CheckpointError(f"{files.file(name).path}: tensor {name!r} has dtype {dtype.name}; "
                                      f"valid: {list(_FLOAT_DTYPES)}")
            dtypes.setdefault(dtype.name, name)
    return dtypes


def _leaf_reader(files: SafetensorsDir, leaf: hf_names.LeafNames,
                 dtype: np.dtype) -> Callable[[tuple[slice, ...]], np.ndarray]:
    """callback(index) -> the params-layout slice ``index`` of one leaf, read from disk.

    JAX calls it once per device; devices holding the same slice (replicated mesh
    axes) get the one read, memoised for the lifetime of this leaf's callback.
    """

    names, stacked, transposed = leaf.names, leaf.stacked, leaf.transposed

    def read_one(name: str, index: tuple, out: np.ndarray | None = None) -> np.ndarray:
        view = files.array(name)  # memory-mapped, HF layout
        view = view.T if transposed else view
        if out is None:
            return np.asarray(view[index], dtype=dtype)  # touches only the slice's pages
        np.copyto(out, view[index], casting="unsafe")  # one strided cast-copy, no temporary
        return out

    def read(index: tuple) -> np.ndarray:
        if stacked == 0:
            return read_one(names[0], index)
        grid = np.arange(len(names)).reshape(leaf.shape[:stacked])[index[:stacked]]  # this slice's tensors
        rest = index[stacked:]
        out = np.empty((*grid.shape, *(len(range(dim)[s]) for dim, s in zip(leaf.shape[stacked:], rest))), dtype)
        for position in np.ndindex(*grid.shape):
            read_one(names[grid[position]], rest, out[position])
        return out

    memo: dict[tuple, np.ndarray] = {}

    def callback(index) -> np.ndarray:
        key = tuple((s.start, s.stop, s.step) for s in index)
        if key not in memo:
            memo[key] = read(tuple(index))
        return memo[key]

    return callback


def _set_path(tree: dict, path: str, value) -> None:
    *parents, leaf = path.split("/")
    for key in parents:
        tree = tree.setdefault(key, {})
    tree[leaf] = value


def load_hf_dir(path: str | os.PathLike, *, dtype: Any = None, mesh: Mesh | None = None,
                shardings: Any = None) -> tuple[DecoderConfig, dict]:
    """Load an HF Llama/Qwen2/Qwen3/Qwen3-MoE checkpoint directory as (DecoderConfig, params).

    ``path`` holds ``config.json`` and ``model.safetensors`` or shards listed in
    ``model.safetensors.index.json``. ``dtype`` (float32 / bfloat16 / float16)
    converts every tensor; None keeps the stored dtype. The config's param_dtype is
    set to the result. ``mesh`` places each leaf straight into
    ``models.param_shardings`` on that mesh (or pass explicit ``shardings``, a pytree
    of Shardings like params); without either, params go to the default device.
    Bad checkpoints raise CheckpointError naming the tensor or field.
    """
    directory = os.fspath(path)
    files = SafetensorsDir(directory)
    cfg = read_hf_config(directory)
    stored = check_tensors(files, cfg)
    if dtype is None and (len(stored) > 1 or "float64" in stored):
        raise CheckpointError(f"{directory}: tensors are stored as {stored} (dtype: example tensor); "
                              "pass dtype=float32|bfloat16|float16 to load_hf_dir to convert them all to one")
    target = np.dtype(jnp_dtype(canonical_dtype_name(next(iter(stored)) if dtype is None else dtype)))
    cfg = cfg.with_dtypes(param_dtype=target.name)
    if shardings is None and mesh is not None:
        shardings = param_shardings(param_shapes(cfg), mesh)
    params: dict = {}
    default = SingleDeviceSharding(jax.local_devices()[0])  # this process's own device
    for leaf_path, leaf in hf_layout(cfg).items():
        sharding = default if shardings is None else _get_path(shardings, leaf_path)
        reader = _leaf_reader(files, leaf, target)
        _set_path(params, leaf_path, jax.make_array_from_callback(leaf.shape, sharding, reader))
    return cfg, params


def _get_path(tree: Any, path: str) -> Any:
    for key in path.split("/"):
        if key not in tree:
            raise ValueError(f"shardings has no entry for params[{path!r}]")
        tree = tree[key]
    return tree
