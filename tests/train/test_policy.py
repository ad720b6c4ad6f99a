"""model.source: the bundled SmolLM2, an HF directory, or a .gguf file converted once."""
import numpy as np
import pytest

from jaxrl_llm import bridge
from jaxrl_llm.train.policy import load_policy, resolve_model_dir


def test_a_gguf_source_loads_the_same_weights_as_the_bundled_conversion(tmp_path, monkeypatch):
    reference = load_policy("smollm2")
    monkeypatch.setenv("JAXRL_CACHE", str(tmp_path))  # a fresh cache: the .gguf is converted here
    gguf = bridge.smollm2_gguf_path()
    policy = load_policy(gguf)
    assert policy.model_dir.startswith(str(tmp_path)) and policy.model_dir != reference.model_dir
    assert resolve_model_dir(gguf) == policy.model_dir  # converted once, then reused
    assert policy.cfg == reference.cfg and policy.eos_token_ids == reference.eos_token_ids
    for name in ("embed", "final_norm"):
        np.testing.assert_array_equal(np.asarray(policy.params[name]), np.asarray(reference.params[name]))


@pytest.mark.parametrize("source, message", [
    ("/no/such/model.gguf", "no such .gguf file"),
    ("/no/such/dir", "no such directory"),
])
def test_missing_sources_name_the_field_and_what_is_valid(source, message):
    with pytest.raises(FileNotFoundError, match=rf"model.source='{source}': {message}; valid: 'smollm2', an HF"):
        resolve_model_dir(source)
