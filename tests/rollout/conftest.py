"""Shared fixtures for the vLLM rollout tests.

ONE real vLLM CPU server (SmolLM2-135M-Instruct, float32, eager mode) is
started per session and shared: startup costs about a minute on 2 cores.
The tests that kill the server are moved to the very end of the
session, and the shared handle restarts a dead server on demand, so test
selection or order can never leave a later test without one.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.vllm_required import require_vllm_env
from jaxrl_llm.rollout.vllm_server import VLLMServer
from jaxrl_llm.rollout.vllm_server_config import VLLMServerConfig

KILLS_SHARED_SERVER = ("test_server_killed_between_steps_stops_with_a_resumable_checkpoint",
                       "test_server_killed_mid_request_raises_clear_error")


def pytest_collection_modifyitems(config, items):
    last = [item for item in items if item.name in KILLS_SHARED_SERVER]
    for item in last:
        items.remove(item)
        items.append(item)


@dataclasses.dataclass(frozen=True)
class SmolLM2:
    hf_dir: str
    cfg: object
    params: dict


@pytest.fixture(scope="session")
def smollm2() -> SmolLM2:
    from jaxrl_llm import bridge

    hf_dir = bridge.smollm2_hf_dir()
    cfg, params = bridge.load_hf_dir(hf_dir)
    return SmolLM2(hf_dir, cfg, params)


class SharedServer:
    """The session's server; get() (re)starts it when it is not running."""

    def __init__(self, config: VLLMServerConfig):
        self.config = config
        self.server = VLLMServer(config)

    def get(self) -> VLLMServer:
        if not self.server.is_running():
            self.server.stop()
            self.server = VLLMServer(self.config)
            self.server.start()
        return self.server

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture(scope="session")
def vllm_env_built() -> None:
    """Fails, naming the cause and the fix, when the vLLM environment is absent (skips
    only with JAXRL_SKIP_VLLM=1); `make test` builds it first."""
    require_vllm_env()


@pytest.fixture(scope="session")
def vllm_server(vllm_env_built, smollm2, tmp_path_factory) -> SharedServer:
    log_dir = Path(tmp_path_factory.mktemp("vllm"))
    config = VLLMServerConfig(model_dir=smollm2.hf_dir, dtype="float32", max_model_len=512, kv_cache_gib=1,
                              enforce_eager=True, log_path=log_dir / "server.log", startup_timeout_s=900)
    shared = SharedServer(config)
    shared.get()
    yield shared
    shared.stop()


@pytest.fixture(scope="session")
def chat_prompts(smollm2):
    """(count, length) -> `count` distinct SmolLM2 chat prompts of exactly
    `length` token ids each (a numbered question, padded with an instruction
    sentence and cut to length, inside the chat template)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(smollm2.hf_dir) / "tokenizer.json"))
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False).ids
    head, tail = encode("<|im_start|>user\n"), encode("<|im_end|>\n<|im_start|>assistant\n")
    filler = encode(" Think about it carefully and answer in one short sentence, with a reason.")

    def make(count: int, length: int) -> list[list[int]]:
        prompts = []
        for i in range(count):
            body = encode(f"Question {i}: what is {i} times {i + 3}, and is the result even or odd?")
            while len(head) + len(body) + len(tail) < length:
                body += filler
            prompts.append(head + body[:length - len(head) - len(tail)] + tail)
        return prompts

    return make


@pytest.fixture(scope="session")
def learner_logprobs(smollm2):
    """(params, sequences, temperature) -> list of float64 arrays: the JAX
    decoder's log p(x_t | x_<t), t >= 1, for each token sequence. Sequences
    are right-padded to a multiple of 64 so few programs are compiled."""
    from jaxrl_llm.models import token_logprobs

    cfg = smollm2.cfg

    @jax.jit
    def batch_logprobs(params, tokens, mask, temperature):
        return token_logprobs(params, cfg, tokens, attention_mask=mask, temperature=temperature)

    def compute(params, sequences, temperature=1.0):
        width = -(-max(len(s) for s in sequences) // 64) * 64
        tokens = np.zeros((len(sequences), width), np.int32)
        mask = np.zeros((len(sequences), width), np.int32)
        for i, seq in enumerate(sequences):
            tokens[i, :len(seq)] = seq
            mask[i, :len(seq)] = 1
        out = np.asarray(batch_logprobs(params, jnp.asarray(tokens), jnp.asarray(mask),
                                        jnp.float32(temperature)), np.float64)
        return [out[i, :len(seq) - 1] for i, seq in enumerate(sequences)]

    return compute
