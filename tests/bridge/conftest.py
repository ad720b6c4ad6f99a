"""Session fixtures: the real SmolLM2-135M-Instruct is loaded once per test session."""
from __future__ import annotations

import os

import pytest

from jaxrl_llm.bridge import load_gguf, smollm2_gguf_path, smollm2_hf_dir


@pytest.fixture(scope="session")
def smollm2():
    """(cfg, params, tokenizer) from the GGUF, float32."""
    return load_gguf(smollm2_gguf_path())


@pytest.fixture(scope="session")
def smollm2_cache_root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("jaxrl_cache"))


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_cache_root):
    """The float32 HF directory smollm2_hf_dir() builds, in a private cache root."""
    return smollm2_hf_dir(smollm2_cache_root)


@pytest.fixture(scope="session")
def hf_gguf_model():
    """transformers' own GGUF loading (its dequantization and q/k un-permutation), as an
    independent reference: LlamaForCausalLM with the state dict load_gguf_checkpoint builds."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    gguf_utils = pytest.importorskip("transformers.modeling_gguf_pytorch_utils")
    path = smollm2_gguf_path()
    config = transformers.AutoConfig.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    config._attn_implementation = "eager"
    with torch.device("meta"):
        skeleton = transformers.LlamaForCausalLM(config)
    state = gguf_utils.load_gguf_checkpoint(path, return_tensors=True, model_to_load=skeleton)["tensors"]
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    return model
