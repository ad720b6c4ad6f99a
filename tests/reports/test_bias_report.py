"""The bias report measures, by differentiating each recipe's real loss, the
length dependence the closed forms predict (docs/objectives.md#length-bias): per-token weight ~ 1/L for
seq-mean-token-mean (exponent -1) and independent of L otherwise (exponent 0)."""
import numpy as np
import pytest

from jaxrl_llm.reports import bias_report


@pytest.fixture(scope="module")
def batch():
    return bias_report.sample_batch(num_prompts=8, group_size=4, max_length=64, seed=1)


@pytest.mark.parametrize("recipe, exponent", [("grpo", -1.0), ("dr_grpo", 0.0), ("dapo", 0.0), ("rloo", 0.0)])
def test_measured_length_exponent(batch, recipe, exponent):
    weights, advantages = bias_report.measured_token_weights(recipe, batch)
    assert bias_report.length_exponent(batch.lengths.astype(float), weights, advantages) == pytest.approx(
        exponent, abs=1e-4)


def test_dr_grpo_weight_is_advantage_over_n_lconst(batch):
    # Hand formula (Dr. GRPO): -dL/dlogp_it = (r_i - mean_g r) / (N * L_const) at ratio 1.
    weights, _ = bias_report.measured_token_weights("dr_grpo", batch)
    rewards = batch.rewards
    expected = (rewards - rewards.mean(axis=1, keepdims=True)).reshape(-1) / (rewards.size * batch.max_length)
    np.testing.assert_allclose(weights, expected, atol=1e-9)


def test_cli_bias_report_writes_table_and_pngs(tmp_path):
    from jaxrl_llm import cli

    assert cli.main(["bias-report", "--out", str(tmp_path), "--recipes", "grpo", "dr_grpo"]) == 0
    for name in ("length_bias.png", "difficulty_bias.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    table = (tmp_path / "bias_table.md").read_text().splitlines()
    assert table[2].startswith("| grpo | seq_mean_token_mean | -1.00 ")
    assert table[3].startswith("| dr_grpo | constant | +0.00 ") or table[3].startswith("| dr_grpo | constant | -0.00 ")
