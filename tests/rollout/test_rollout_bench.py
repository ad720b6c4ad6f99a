"""`make bench-rollout`'s JAX-sampler-vs-vLLM ratio table (`benchmarks.cpu.rollout`) at tiny size: one
cell, both engines on the same prompts and seed, against the real vLLM CPU server it starts."""
import json
import math
from types import SimpleNamespace

import pytest

from jaxrl_llm.benchmarks.cpu import rollout


@pytest.mark.slow  # starts its own vLLM server (~1-2 min on 2 cores); make test-all
@pytest.mark.vllm
def test_ratio_table_at_tiny_size(vllm_env_built, tmp_path):
    out = tmp_path / "rollout.json"
    rollout.main(["--only-table", "--table-batches", "8", "--table-lengths", "8", "--table-modes", "eager",
                  "--table-seeds", "0,1", "--out", str(out)])
    eos, fixed = json.loads(out.read_text())["ratio_table"]
    for cell in (eos, fixed):
        assert cell["batch"] == 8 and cell["max_tokens"] == 8 and cell["vllm_mode"] == "eager"
        ratios = [(t["jax_tokens"] / t["jax_s"]) / (t["vllm_tokens"] / t["vllm_s"]) for t in cell["per_seed"]]
        assert cell["ratio"] == pytest.approx(math.sqrt(ratios[0] * ratios[1]))  # geometric mean of 2 seeds
    # at most 8 new tokens per sequence with EOS; exactly 8 on both engines with ignore_eos
    assert 0 < eos["jax_tokens"] <= 2 * 64 and 0 < eos["vllm_tokens"] <= 2 * 64
    assert fixed["jax_tokens"] == fixed["vllm_tokens"] == 2 * 64


class FakeEngine:
    """A stand-in engine (fake): every row returns `length` tokens; records the calls."""

    def __init__(self, length):
        self.length, self.calls = length, []

    def generate(self, prompts, n, sampling):
        self.calls.append(sampling)
        return [SimpleNamespace(num_completion_tokens=self.length(sampling)) for _ in range(len(prompts) * n)]


def test_time_cell_runs_every_seed_with_ignore_eos_and_checks_fixed_lengths():
    jax_fake = FakeEngine(lambda sp: sp.max_tokens if sp.ignore_eos else 3)
    vllm_fake = FakeEngine(lambda sp: sp.max_tokens if sp.ignore_eos else 2)
    timings = rollout.time_cell(jax_fake, vllm_fake, [[1], [2]], 2, 16, "fixed", [0, 1, 2])
    assert [t.seed for t in timings] == [0, 1, 2] and {t.jax_tokens for t in timings} == {t.vllm_tokens for t in timings} == {64}
    assert all(sp.ignore_eos for sp in jax_fake.calls + vllm_fake.calls) and len(jax_fake.calls) == 4  # + 1 untimed
    assert [sp.seed for sp in vllm_fake.calls] == [0, 0, 1, 2]
    eos = rollout.time_cell(jax_fake, vllm_fake, [[1], [2]], 2, 16, "eos", [0, 1, 2])
    assert {(t.jax_tokens, t.vllm_tokens) for t in eos} == {(12, 8)}  # EOS: each engine its own lengths
    short = FakeEngine(lambda sp: 15)  # an engine that stops early although told to ignore EOS
    with pytest.raises(RuntimeError, match="fixed-length cell drew 64 \\(JAX\\) / 60 \\(vLLM\\) tokens"):
        rollout.time_cell(jax_fake, short, [[1], [2]], 2, 16, "fixed", [0])
