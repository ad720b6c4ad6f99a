"""params -> HF checkpoint directory (config, safetensors, tokenizer), written atomically.

This runs on every RL step's weight sync, so it is built for speed: each params
leaf is transposed to HF's [out, in] layout and cast by one jitted op on the
device, fetched to the host while the next leaf converts, and its per-layer
slices (views, no copies) are streamed into the file. The sync writer skips the
device op for leaves that already sit in host memory in the stored dtype and
transposes them while copying them into the file. Extra memory: about one leaf
on device and two on host.
"""
from __future__ import annotations

import functools
import json
import os
from typing import Any, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.bridge.atomic import write_directory_atomically
from jaxrl_llm.bridge.errors import CheckpointError
from jaxrl_llm.bridge.hf_load import hf_layout
from jaxrl_llm.bridge.safetensors_io import (INDEX_FILE, SINGLE_FILE, write_safetensors_in_place,
                                             write_safetensors_stream)
from jaxrl_llm.bridge.tokenizer import TokenizerBundle, copy_tokenizer_files
from jaxrl_llm.models.config import DecoderConfig, canonical_dtype_name

_SAVE_DTYPES = ("float32", "bfloat16", "float16")


@functools.lru_cache(maxsize=None)
def _to_hf_layout(transposed: bool, dtype_name: str):
    """Jitted x -> swap last two axes (if transposed) -> cast; one fused XLA op per leaf."""
    dtype = jnp.dtype(dtype_name)

    def convert(x):
        return (jnp.swapaxes(x, -1, -2) if transposed else x).astype(dtype)

    return jax.jit(convert)


def check_params(params: Mapping[str, Any], cfg: DecoderConfig) -> None:
    """Every leaf of ``cfg``'s layout present with the right shape, nothing extra."""
    layout = hf_layout(cfg)
    flat = {}
    for key, value in params.items():
        if key == "layers" and isinstance(value, Mapping):
            flat.update({f"layers/{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    missing, extra = sorted(set(layout) - set(flat)), sorted(set(flat) - set(layout))
    if missing or extra:
        raise CheckpointError(f"params do not match config {cfg.architecture}: missing {missing}, unexpected {extra}")
    for path, (shape, *_) in layout.items():
        got = tuple(np.shape(flat[path]))
        if got != shape:
            raise CheckpointError(f"params[{path!r}] has shape {list(got)}, config {cfg.architecture} needs {list(shape)}")
        dtype = np.dtype(flat[path].dtype)
        if not np.issubdtype(dtype, np.floating) and dtype.name != "bfloat16":
            raise CheckpointError(f"params[{path!r}] has dtype {dtype.name}; valid: a float dtype")


def _leaf(params: Mapping[str, Any], path: str):
    return params["layers"][path[len("layers/"):]] if path.startswith("layers/") else params[path]


def _hf_specs(cfg: DecoderConfig, dtype: np.dtype) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
    """(HF name, dtype, HF shape) of every tensor, in the order ``_hf_arrays`` yields them."""
    specs = []
    for shape, names, stacked, transposed in hf_layout(cfg).values():
        per_tensor = shape[stacked:]
        hf_shape = tuple(reversed(per_tensor)) if transposed else per_tensor
        specs += [(name, dtype, hf_shape) for name in names]
    return specs


def _in_host_memory(leaf) -> bool:
    """A numpy array, or a JAX array whose buffers are on the CPU (readable by numpy without a copy)."""
    return not isinstance(leaf, jax.Array) or all(d.platform == "cpu" for d in leaf.devices())


def _hf_arrays(params: Mapping[str, Any], cfg: DecoderConfig, dtype: np.dtype, *,
               views: bool = False) -> Iterator[np.ndarray]:
    """HF-layout host arrays, one per tensor; the next leaf converts on device while this one is written.

    With ``views`` a leaf already in host memory and in ``dtype`` is not transposed on device:
    its tensors come out as transposed views (``x.swapaxes(-1, -2)``), for a writer that lays
    them out while copying them into the file (one pass over the data instead of two)."""
    def start(path, transposed):
        leaf = _leaf(params, path)
        same_dtype = np.dtype(leaf.dtype) == dtype
        if same_dtype and (not transposed or views and _in_host_memory(leaf)):
            return leaf  # nothing to do on device
        return _to_hf_layout(transposed, dtype.name)(leaf)  # async dispatch

    items = [(path, leaf.shape[:leaf.stacked], leaf.transposed) for path, leaf in hf_layout(cfg).items()]
    pending = start(items[0][0], items[0][2])
    for index, (_, stacked_shape, transposed) in enumerate(items):
        as_view = transposed and pending is _leaf(params, items[index][0])
        host = np.asarray(pending) if as_view else np.ascontiguousarray(pending)  # waits for this leaf only
        if as_view:
            host = host.swapaxes(-1, -2)
        if index + 1 < len(items):
            pending = start(items[index + 1][0], items[index + 1][2])
        yield from (host[i] for i in np.ndindex(*stacked_shape))  # per-layer (per-expert) views; () = whole


def hf_config_dict(cfg: DecoderConfig, dtype: str) -> dict:
    config = cfg.to_hf()
    config["torch_dtype"] = dtype  # transformers 4 / vLLM key; transformers 5 maps it to "dtype"
    return config


def generation_config_dict(cfg: DecoderConfig) -> dict:
    """Only token ids: vLLM applies sampling defaults found here (temperature, top_p, ...) to every
    request, and RL rollouts must sample from the untruncated policy."""
    extra = cfg.hf_extra
    return {key: extra[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id") if extra.get(key) is not None}


def _shard_specs(specs: list, max_shard_bytes: int | None) -> list[list]:
    """Split the tensor list into consecutive groups of at most ``max_shard_bytes`` (one tensor may exceed it)."""
    if not max_shard_bytes:
        return [specs]
    shards, current, size = [], [], 0
    for spec in specs:
        nbytes = int(np.prod(spec[2])) * spec[1].itemsize
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(spec)
        size += nbytes
    return shards + [current]


def write_weights(directory: str, cfg: DecoderConfig, params: Mapping[str, Any], dtype: str, *,
                  max_shard_bytes: int | None = None, fsync: bool = False) -> list[str]:
    """The safetensors file(s) (+ index when sharded) into ``directory``; returns the file names."""
    np_dtype = np.dtype(jnp.dtype(dtype))
    shards = _shard_specs(_hf_specs(cfg, np_dtype), max_shard_bytes)
    arrays = _hf_arrays(params, cfg, np_dtype)
    if len(shards) == 1:
        write_safetensors_stream(os.path.join(directory, SINGLE_FILE), shards[0], arrays, fsync=fsync)
        return [SINGLE_FILE]
    names, weight_map, total = [], {}, 0
    for number, specs in enumerate(shards, start=1):
        name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        group = [next(arrays) for _ in specs]
        total += write_safetensors_stream(os.path.join(directory, name), specs, group, fsync=fsync)
        weight_map.update({spec[0]: name for spec in specs})
        names.append(name)
    with open(os.path.join(directory, INDEX_FILE), "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return names + [INDEX_FILE]


def write_sync_dir(cfg: DecoderConfig, params: Mapping[str, Any], directory: str | os.PathLike, *,
                   dtype: str = "float32", workers: int = 2) -> str:
    """The weight-sync copy of ``params``: config.json, generation_config.json and one
    model.safetensors in ``directory``, written for speed, not durability.

    Unlike ``save_hf_dir`` nothing is atomic or fsynced (the caller publishes the directory
    by renaming it), and an existing directory holding an older copy of the same model is
    rewritten in place: the tensors go straight into the old file's mapped pages, by ``workers``
    threads (``write_safetensors_in_place``). A leaf that must change dtype is transposed and
    cast by one op on device while the previous one is copied; a leaf already in host memory
    and in ``dtype`` is transposed by that copy itself (one pass instead of a transpose into a
    temporary and a second copy; docs/benchmarks.md, weight sync, has the measurement).
    Returns the directory's absolute path.
    """
    dtype = canonical_dtype_name(dtype, "dtype")
    if dtype not in _SAVE_DTYPES:
        raise ValueError(f"dtype={dtype!r}; valid: {_SAVE_DTYPES}")
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers={workers!r} must be an int >= 1")
    check_params(params, cfg)
    directory = os.path.abspath(os.fspath(directory))
    os.makedirs(directory, exist_ok=True)
    np_dtype = np.dtype(jnp.dtype(dtype))
    for stale in os.listdir(directory):  # e.g. shards of an export made another way
        if stale.endswith(".safetensors") and stale != SINGLE_FILE or stale == INDEX_FILE:
            os.remove(os.path.join(directory, stale))
    write_safetensors_in_place(os.path.join(directory, SINGLE_FILE), _hf_specs(cfg, np_dtype),
                               _hf_arrays(params, cfg, np_dtype, views=True), workers=workers)
    _write_json(os.path.join(directory, "config.json"), hf_config_dict(cfg, dtype))
    _write_json(os.path.join(directory, "generation_config.json"), generation_config_dict(cfg))
    return directory


def save_hf_dir(cfg: DecoderConfig, params: Mapping[str, Any], out_dir: str | os.PathLike, *,
                dtype: str = "float32", tokenizer_dir: str | os.PathLike | None = None,
                tokenizer: TokenizerBundle | None = None, max_shard_bytes: int | None = None,
                fsync: bool = True) -> str:
    """Write an HF checkpoint directory that transformers and vLLM load; returns its absolute path.

    Files: config.json, model.safetensors (or shards of at most ``max_shard_bytes``
    + model.safetensors.index.json), generation_config.json, and the tokenizer files
    copied from ``tokenizer_dir`` or written from ``tokenizer`` (at most one of them).
    The directory appears atomically: built next to ``out_dir``, fsynced, then
    renamed (an existing ``out_dir`` is swapped out), so a reader never sees a
    partial checkpoint. ``dtype``: float32 | bfloat16 | float16 of the stored weights.
    """
    dtype = canonical_dtype_name(dtype, "dtype")
    if dtype not in _SAVE_DTYPES:
        raise ValueError(f"dtype={dtype!r}; valid: {_SAVE_DTYPES}")
    if tokenizer_dir is not None and tokenizer is not None:
        raise ValueError("pass tokenizer_dir or tokenizer, not both")
    if tokenizer_dir is not None and not os.path.isdir(tokenizer_dir):
        raise CheckpointError(f"tokenizer_dir {os.fspath(tokenizer_dir)!r} is not a directory")
    check_params(params, cfg)

    def fill(directory: str) -> None:
        write_weights(directory, cfg, params, dtype, max_shard_bytes=max_shard_bytes)
        _write_json(os.path.join(directory, "config.json"), hf_config_dict(cfg, dtype))
        _write_json(os.path.join(directory, "generation_config.json"), generation_config_dict(cfg))
        if tokenizer_dir is not None:
            copy_tokenizer_files(tokenizer_dir, directory)
        if tokenizer is not None:
            tokenizer.save(directory)

    return write_directory_atomically(out_dir, fill, fsync=fsync)


def _write_json(path: str, value: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, sort_keys=True)
