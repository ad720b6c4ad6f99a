"""Checkpoint bridge: HF safetensors and GGUF -> params, params -> HF safetensors (atomic).

Public API:
    load_hf_dir(path, *, dtype=None, mesh=None, shardings=None) -> (DecoderConfig, params)
    save_hf_dir(cfg, params, out_dir, *, dtype="float32", tokenizer_dir=None, tokenizer=None,
                max_shard_bytes=None, fsync=True) -> str
    load_gguf(path, *, dtype="float32") -> (DecoderConfig, params, TokenizerBundle)
    smollm2_gguf_path() -> str;  smollm2_hf_dir(cache_root=None) -> str
    gguf_hf_dir(gguf_path, cache_root=None) -> str  (any GGUF, converted once into the cache)
The HF <-> params name map lives in ``jaxrl_llm.models.hf_names``.
"""
from jaxrl_llm.bridge.atomic import write_directory_atomically
from jaxrl_llm.bridge.errors import CheckpointError
from jaxrl_llm.bridge.gguf_load import default_cache_root, gguf_hf_dir, load_gguf, smollm2_gguf_path, smollm2_hf_dir
from jaxrl_llm.bridge.gguf_reader import undo_rotary_permutation
from jaxrl_llm.bridge.hf_load import load_hf_dir, read_hf_config
from jaxrl_llm.bridge.hf_save import save_hf_dir
from jaxrl_llm.bridge.safetensors_io import SafetensorsDir, SafetensorsFile, write_safetensors
from jaxrl_llm.bridge.tokenizer import TokenizerBundle, copy_tokenizer_files, tokenizer_from_gguf

__all__ = [
    "CheckpointError", "TokenizerBundle", "SafetensorsDir", "SafetensorsFile",
    "load_hf_dir", "read_hf_config", "save_hf_dir", "load_gguf", "gguf_hf_dir", "smollm2_gguf_path", "smollm2_hf_dir",
    "default_cache_root", "tokenizer_from_gguf", "copy_tokenizer_files", "undo_rotary_permutation",
    "write_directory_atomically", "write_safetensors",
]
