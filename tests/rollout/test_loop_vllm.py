"""Two RL steps through the real vLLM CPU server: rollouts, grading, a learner step
and the weight sync after each step (the server is restored to the base weights after)."""
import pytest

from jaxrl_llm.rollout import DiskWeightSync, VLLMClient, bridge_export
from jaxrl_llm.train import loop
from jaxrl_llm.train.config import load_config
from jaxrl_llm.train.metrics import read_metrics

pytestmark = pytest.mark.vllm


def test_two_rl_steps_through_vllm_advance_the_weight_version(vllm_server, smollm2, tmp_path):
    server = vllm_server.get()
    cfg = load_config("experiments/demo.py", [
        "total_steps=2", "rollout.engine=vllm", f"rollout.server_urls=[{server.url}]",
        "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4", "rollout.max_tokens=8",
        "train.micro_batch_size=8", "checkpoint.every_steps=0", "checkpoint.async_save=false",
        "metrics.tensorboard=false", f"run_dir={tmp_path / 'run'}", f"model.source={smollm2.hf_dir}"])
    try:
        out = loop.train(cfg)
    finally:  # the shared server goes back to the base weights for the other tests
        client = VLLMClient([server.url])
        sync = DiskWeightSync(client, bridge_export(smollm2.cfg))
        sync.push(smollm2.params, version=0)
        sync.close()
    rows = read_metrics(cfg.run_path)
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["weight_version"] for r in rows] == [0.0, 1.0]  # step 2 sampled from the synced weights
    assert out["engine_version"] == 2
    for r in rows:
        assert r["reward_errors"] == 0.0 and 0.0 <= r["reward"] <= 1.0
        assert r["time_sync_s"] > 0.0
        # graded: the reward is the mean of {0, 1} scores of 8 samples
        assert (r["reward"] * 8) == pytest.approx(round(r["reward"] * 8))
