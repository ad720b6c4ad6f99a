"""`make bench-rollout`'s JAX-sampler-vs-vLLM ratio table (`benchmarks.rollout`) at tiny size: one
cell, both engines on the same prompts and seed, against the real vLLM CPU server it starts."""
import json

import pytest

from jaxrl_llm.benchmarks import rollout


@pytest.mark.slow  # starts its own vLLM server (~1-2 min on 2 cores); make test-all
@pytest.mark.vllm
def test_ratio_table_at_tiny_size(vllm_env_built, tmp_path):
    out = tmp_path / "rollout.json"
    rollout.main(["--only-table", "--table-batches", "8", "--table-lengths", "8",
                  "--table-rounds", "1", "--out", str(out)])
    (cell,) = json.loads(out.read_text())["ratio_table"]
    assert cell["batch"] == 8 and cell["max_tokens"] == 8  # the table's 8 prompts x 1 sample
    # at most 8 new tokens per sequence on each engine, and the ratio is the two rates' quotient
    assert 0 < cell["jax_tokens"] <= 64 and 0 < cell["vllm_tokens"] <= 64
    assert cell["ratio"] == pytest.approx(cell["jax_tokens_per_s"] / cell["vllm_tokens_per_s"])
