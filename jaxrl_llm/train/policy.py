"""The policy's model and tokenizer side: loading it, and prompts/completions <-> token ids."""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Sequence

from jaxrl_llm.data import ChatTemplate, Example
from jaxrl_llm.models import DecoderConfig
from jaxrl_llm.rollout.types import RolloutBatch

log = logging.getLogger(__name__)

SOURCE_HELP = "'smollm2', an HF directory (config.json, *.safetensors, tokenizer.json) or a .gguf file"


@dataclasses.dataclass
class Policy:
    """The model and its tokenizer side."""

    cfg: DecoderConfig
    params: Any
    tokenizer: Any  # tokenizers.Tokenizer
    chat: ChatTemplate
    eos_token_ids: tuple[int, ...]
    pad_id: int
    model_dir: str


def resolve_model_dir(source: str) -> str:
    """The HF directory of model.source: the bundled SmolLM2, a directory as is, or a .gguf
    file converted once (dequantised) into the cache."""
    from jaxrl_llm.bridge import gguf_hf_dir, smollm2_hf_dir

    if source == "smollm2":
        return smollm2_hf_dir()
    path = os.fspath(source)
    if path.endswith(".gguf"):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"model.source={source!r}: no such .gguf file; valid: {SOURCE_HELP}")
        log.info("converting %s to an HF directory (once; cached)", path)
        return gguf_hf_dir(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"model.source={source!r}: no such directory; valid: {SOURCE_HELP}")
    return path


def load_policy(source: str) -> Policy:
    """The float32 policy of model.source (see `resolve_model_dir`)."""
    from tokenizers import Tokenizer

    from jaxrl_llm.bridge import load_hf_dir

    model_dir = resolve_model_dir(source)
    cfg, params = load_hf_dir(model_dir, dtype="float32")
    tokenizer = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    chat = ChatTemplate.from_hf_dir(model_dir)
    eos_token = chat.special_tokens.get("eos_token")
    eos_id = tokenizer.token_to_id(eos_token) if eos_token is not None else None
    if eos_id is None:
        raise ValueError(f"{model_dir}: the tokenizer names no eos_token; cannot tell where completions end")
    return Policy(cfg, params, tokenizer, chat, (eos_id,), pad_id=eos_id, model_dir=model_dir)


def encode_prompts(policy: Policy, examples: Sequence[Example]) -> list[list[int]]:
    """Token ids of each example's prompt rendered with the model's chat template."""
    return [policy.tokenizer.encode(policy.chat.render_prompt(e.prompt), add_special_tokens=False).ids
            for e in examples]


def decode_completions(policy: Policy, rollouts: RolloutBatch) -> list[str]:
    """Each record's completion text, EOS tokens removed."""
    eos = set(policy.eos_token_ids)
    return [policy.tokenizer.decode([t for t in r.completion_token_ids.tolist() if t not in eos])
            for r in rollouts.records]
