"""ReMax and GDPO in the RL loop: 2-step runs on the tiny random decoder (JAX engine), what the
learner receives checked against independent computations (transformers' greedy generate and
the graders called here), and the config refusals."""
import numpy as np
import pytest
import torch
import transformers

from jaxrl_llm.train.run import loop
from jaxrl_llm.train.config import ConfigError, Config, apply_overrides
from jaxrl_llm.train.run.metrics import read_metrics
from tests.train import user_plugins
from tests.train.tiny_run import tiny_config

LENGTH = "tests.train.user_plugins:tenths_of_length_reward"


@pytest.fixture
def recorded(monkeypatch):
    """The arguments of every `learn` call of the loop."""
    calls, real_learn = [], loop.learn

    def learn(learner, state, rollouts, sampled, **kw):
        calls.append(dict(rollouts=rollouts, rewards=np.asarray(sampled.rewards), **sampled.extras))
        return real_learn(learner, state, rollouts, sampled, **kw)

    monkeypatch.setattr(loop, "learn", learn)
    return calls


def test_remax_run_uses_the_greedy_responses_reward_as_the_baseline(tiny_model_dir, tmp_path, recorded):
    cfg = tiny_config(tiny_model_dir, tmp_path / "remax", "recipe.name=remax", "total_steps=2",
                      f"task.reward_fn={LENGTH}", "train.precision=fp32", "rollout.max_tokens=6")
    loop.train(cfg)
    rows = read_metrics(cfg.run_path)
    assert [r["step"] for r in rows] == [1, 2]
    first = recorded[0]
    group = cfg.rollout.samples_per_prompt
    assert first["rollouts"].samples_per_prompt == group  # the greedy rows stay out of the learner batch
    assert len(first["rollouts"].records) == cfg.rollout.prompts_per_step * group
    # Independent: transformers' greedy decoding of step 1's prompts by the initial weights, graded here.
    tok = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    want = []
    for p in range(cfg.rollout.prompts_per_step):
        prompt = first["rollouts"].records[p * group].prompt_token_ids
        with torch.no_grad():
            out = model.generate(torch.tensor(prompt[None]), do_sample=False, max_new_tokens=6,
                                 eos_token_id=tok.eos_token_id, pad_token_id=0)
        text = tok.decode([t for t in out[0, len(prompt):].tolist() if t != tok.eos_token_id])
        want.append(user_plugins.tenths_of_length_reward(text, None))
    np.testing.assert_allclose(first["baseline_rewards"], want, rtol=1e-6)
    assert rows[0]["baseline_reward"] == pytest.approx(np.mean(want), rel=1e-6)
    assert "reward_parts" not in first and "advantages" not in first


def test_gdpo_run_grades_each_reward_and_logs_it(tiny_model_dir, tmp_path, recorded):
    cfg = tiny_config(tiny_model_dir, tmp_path / "gdpo", "recipe.name=gdpo", "total_steps=2",
                      f"task.reward_fns=[addition, {LENGTH}]", "task.reward_weights=[1.0, 0.5]")
    loop.train(cfg)
    rows = read_metrics(cfg.run_path)
    from jaxrl_llm.train.policy import decode_completions, load_policy

    policy = load_policy(cfg.model.source)
    for call, row in zip(recorded, rows):
        texts = decode_completions(policy, call["rollouts"])
        parts = call["reward_parts"]
        assert parts.shape == (cfg.rollout.prompts_per_step, cfg.rollout.samples_per_prompt, 2)
        lengths = np.array([user_plugins.tenths_of_length_reward(t, None) for t in texts]).reshape(parts.shape[:2])
        np.testing.assert_allclose(parts[:, :, 1], lengths, rtol=1e-6)
        np.testing.assert_allclose(call["rewards"], parts[:, :, 0] + 0.5 * parts[:, :, 1], rtol=1e-6)
        assert row["reward_tenths_of_length_reward"] == pytest.approx(lengths.mean(), rel=1e-6)
        assert row["reward_addition"] == pytest.approx(parts[:, :, 0].mean(), abs=1e-7)
        # the pass rate judges the first grader's reward (addition: a random model is never right),
        # not the weighted sum (0.5 * length / 10 reaches 1 for long answers)
        assert row["pass_rate"] == pytest.approx(float(np.mean(parts[:, :, 0] >= 1.0)))


@pytest.mark.parametrize("overrides, message", [
    (["task.reward_fns=[exact, addition]", "task.reward_weights=[1.0]"],
     r"task.reward_weights = \(1.0,\) has 1 weights for 2 graders"),
    (["task.reward_fn=exact", "task.reward_fns=[exact, addition]"], "task.reward_fn = 'exact' and task.reward_fns"),
    (["task.reward_weights=[1.0]"], "task.reward_weights = \\(1.0,\\) is set without task.reward_fns"),
    (["task.reward_fns=[tests.train.user_plugins:answer_length_reward, tests.rewards.x:answer_length_reward]"],
     "names two graders alike"),
    (["recipe.name=remax", "rollout.dynamic_sampling=true"], "rollout.dynamic_sampling is on, with recipe.advantage = "
                                                               "'remax'"),
    (["recipe.name=gdpo", "shaping.darling=answer"], "shaping.darling = 'answer' shape the sampled rewards only"),
    (["recipe.advantage=remax", "task.name=guess_number"], "is a multi-turn environment, with recipe.advantage"),
    (["recipe.name=gdpo", "recipe.kl_beta=0.1", "recipe.kl_mode=reward"], "recipe.kl_mode = 'reward'"),
    (["recipe.name=dapo", "recipe.advantage=gdpo", "rollout.dynamic_sampling=false"], "recipe.overlong_buffer"),
])
def test_config_refuses_what_cannot_run_naming_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(Config(), overrides)


def test_gdpo_weights_reach_the_estimator():
    from jaxrl_llm.train.plan import plan_run

    cfg = apply_overrides(Config(), ["recipe.name=gdpo", "task.reward_fns=[exact, addition]",
                                     "task.reward_weights=[2.0, 0.5]"])
    assert plan_run(cfg).recipe.advantage_fn.weights == (2.0, 0.5)
    assert plan_run(cfg).greedy_baseline is False
    assert plan_run(apply_overrides(Config(), ["recipe.name=remax"])).greedy_baseline is True


@pytest.mark.slow  # two 6-step runs, ~3 min on 2 cores
def test_remax_learns_from_one_sample_per_prompt_where_grpo_gets_no_signal(tmp_path, stopping_model_dir):
    """The effect of a baseline that is not the group's own mean: with one sample per prompt
    GRPO's advantage is 0 (a lone sample is its own mean), ReMax's is r - r(greedy). The reward
    is the answer's length (tenths of its characters) on a tiny model that stops early."""
    from tests.train.tiny_run import late, tiny_run

    common = ["rollout.samples_per_prompt=1", "rollout.prompts_per_step=16", "rollout.max_tokens=8",
              f"task.reward_fn={LENGTH}", "train.micro_batch_size=16"]
    grpo = tiny_run(stopping_model_dir, tmp_path / "grpo", *common, "recipe.name=grpo")
    remax = tiny_run(stopping_model_dir, tmp_path / "remax", *common, "recipe.name=remax")
    assert grpo[0]["length_mean"] == remax[0]["length_mean"]  # step 1: the same samples
    assert all(r["advantage_token_mean"] == 0.0 for r in grpo)
    print("length_mean grpo", [r["length_mean"] for r in grpo], "remax", [r["length_mean"] for r in remax],
          "baseline_reward", [r["baseline_reward"] for r in remax])
    assert late(remax, "length_mean") > late(grpo, "length_mean") + 0.5
