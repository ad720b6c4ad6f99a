"""HF tokenizer files (tokenizer.json + tokenizer_config.json) from a GGUF's vocabulary.

A GGUF with ``tokenizer.ggml.model = gpt2`` holds a byte-level BPE (Sennrich
et al. 2016; GPT-2's byte-to-unicode alphabet, Radford et al. 2019): the
token strings, the merges in priority order, a type per token (3 = control,
i.e. special; 4 = user-defined), the special ids and the chat template.
``tokenizer.ggml.pre`` names llama.cpp's pre-tokenizer regex, which we map to
the equivalent ``tokenizers`` pre-tokenizer. The resulting directory loads
with ``transformers.AutoTokenizer`` (4.x and 5.x) and therefore with vLLM.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from jaxrl_llm.bridge.errors import CheckpointError
from jaxrl_llm.bridge.gguf_reader import field_value

# Files a HF checkpoint may use for its tokenizer; copied verbatim by ``copy_tokenizer_files``.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json")
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


def _gpt2_byte_level() -> pre_tokenizers.PreTokenizer:
    # GPT-2's split regex ('s|'t|...| ?\p{L}+| ?\p{N}+|...) followed by the byte -> unicode map.
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    # llama.cpp's "smollm"/"starcoder" regex list: "\p{N}" (every digit alone), then GPT-2's.
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2_byte_level()])


# tokenizer.ggml.pre -> pre-tokenizer (only the ones whose regexes we have checked against llama.cpp).
PRE_TOKENIZERS = {"gpt-2": _gpt2_byte_level, "smollm": _digits_then_gpt2, "starcoder": _digits_then_gpt2}


@dataclasses.dataclass(frozen=True)
class TokenizerBundle:
    """A ``tokenizers.Tokenizer`` plus what ``tokenizer_config.json`` adds (special tokens, chat template)."""

    tokenizer: Tokenizer
    bos_token: str | None
    eos_token: str | None
    pad_token: str | None
    unk_token: str | None
    chat_template: str | None
    add_bos_token: bool = False
    add_eos_token: bool = False
    model_max_length: int | None = None

    def tokenizer_config(self) -> dict:
        named = {self.bos_token, self.eos_token, self.pad_token, self.unk_token}
        added = self.tokenizer.get_added_tokens_decoder()
        config = {
            # The generic fast class loads tokenizer.json verbatim in transformers 4 and 5.
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self.bos_token, "eos_token": self.eos_token,
            "pad_token": self.pad_token, "unk_token": self.unk_token,
            "add_bos_token": self.add_bos_token, "add_eos_token": self.add_eos_token,
            "additional_special_tokens": [t.content for _, t in sorted(added.items())
                                          if t.special and t.content not in named],
            "clean_up_tokenization_spaces": False,
            "added_tokens_decoder": {str(i): {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized,
                                              "rstrip": t.rstrip, "single_word": t.single_word, "special": t.special}
                                     for i, t in sorted(added.items())},
        }
        if self.model_max_length:
            config["model_max_length"] = self.model_max_length
        if self.chat_template:
            config["chat_template"] = self.chat_template
        return config

    def files(self) -> dict[str, str]:
        """File name -> text of the HF tokenizer files."""
        special = {key: getattr(self, key) for key in ("bos_token", "eos_token", "pad_token", "unk_token")
                   if getattr(self, key) is not None}
        config = self.tokenizer_config()
        special["additional_special_tokens"] = config["additional_special_tokens"]
        return {"tokenizer.json": self.tokenizer.to_str(),
                "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False),
                "special_tokens_map.json": json.dumps(special, indent=2, ensure_ascii=False)}

    def save(self, directory: str | os.PathLike) -> list[str]:
        """Write the tokenizer files into ``directory`` (not fsynced; see ``atomic``); returns their paths."""
        paths = []
        for name, text in self.files().items():
            path = os.path.join(directory, name)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            paths.append(path)
        return paths


def copy_tokenizer_files(source_dir: str | os.PathLike, directory: str | os.PathLike) -> list[str]:
    """Copy whichever of TOKENIZER_FILES exist in ``source_dir``; none at all is an error."""
    copied = []
    for name in TOKENIZER_FILES:
        source = os.path.join(source_dir, name)
        if os.path.isfile(source):
            copied.append(shutil.copyfile(source, os.path.join(directory, name)))
    if not copied:
        raise CheckpointError(f"tokenizer_dir {os.fspath(source_dir)!r} holds none of the tokenizer files {TOKENIZER_FILES}")
    return copied


def tokenizer_from_gguf(reader: gguf.GGUFReader) -> TokenizerBundle:
    """Byte-level BPE tokenizer + special tokens + chat template from GGUF metadata."""
    path = reader.data.filename
    kind = field_value(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise CheckpointError(f"{path}: tokenizer.ggml.model={kind!r} is not supported; valid: 'gpt2' (byte-level BPE)")
    add_eos = bool(field_value(reader, "tokenizer.ggml.add_eos_token", False))
    if add_eos:
        raise CheckpointError(f"{path}: tokenizer.ggml.add_eos_token=True is not supported; valid: False")
    pre = field_value(reader, "tokenizer.ggml.pre", "gpt-2")
    if pre not in PRE_TOKENIZERS:
        raise CheckpointError(f"{path}: tokenizer.ggml.pre={pre!r} is not supported; valid: {sorted(PRE_TOKENIZERS)}")
    tokens = list(field_value(reader, "tokenizer.ggml.tokens"))
    token_types = list(field_value(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    vocab = {token: index for index, token in enumerate(tokens)}
    if len(vocab) != len(tokens) or len(token_types) != len(tokens):
        raise CheckpointError(f"{path}: tokenizer.ggml.tokens has {len(tokens)} entries, {len(vocab)} distinct, "
                              f"and token_type {len(token_types)}; they must all be equal")
    merges = [_split_merge(path, merge) for merge in field_value(reader, "tokenizer.ggml.merges")]

    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                  for i, kind in enumerate(token_types) if kind == _CONTROL])
    tokenizer.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                          for i, kind in enumerate(token_types) if kind == _USER_DEFINED])

    def token_of(key: str) -> str | None:
        index = field_value(reader, f"tokenizer.ggml.{key}_token_id", None)
        if index is not None and not 0 <= int(index) < len(tokens):
            raise CheckpointError(f"{path}: tokenizer.ggml.{key}_token_id={index} is outside the vocabulary [0, {len(tokens)})")
        return None if index is None else tokens[int(index)]

    bos = token_of("bos")
    add_bos = bool(field_value(reader, "tokenizer.ggml.add_bos_token", False))
    tokenizer.post_processor = _post_processor(bos if add_bos else None, tokenizer)
    arch = field_value(reader, "general.architecture", "llama")
    return TokenizerBundle(
        tokenizer=tokenizer, bos_token=bos, eos_token=token_of("eos"), pad_token=token_of("padding"),
        unk_token=token_of("unknown"), chat_template=field_value(reader, "tokenizer.chat_template", None),
        add_bos_token=add_bos, add_eos_token=add_eos,
        model_max_length=field_value(reader, f"{arch}.context_length", None))


def _split_merge(path: str, merge: str) -> tuple[str, str]:
    parts = merge.split(" ")
    if len(parts) != 2:
        raise CheckpointError(f"{path}: merge {merge!r} in tokenizer.ggml.merges is not 'left right'")
    return parts[0], parts[1]


def _post_processor(bos: str | None, tokenizer: Tokenizer) -> processors.PostProcessor:
    if bos is None:  # ids unchanged; offsets kept raw like HF's own byte-level tokenizers
        return processors.ByteLevel(trim_offsets=False)
    bos_id = tokenizer.token_to_id(bos)
    return processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                         special_tokens=[(bos, bos_id)])
