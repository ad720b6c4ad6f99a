"""Multi-turn episodes (train/sample/episodes.py): scripted policies against both built-in
environments (rewards, limits, discount, per-token loss masks checked token by token
against the chat template's own rendering of the dialogue), and a tiny random decoder on
the JAX sampler, whose policy-token log-probs the learner reproduces."""
import dataclasses
import re

import numpy as np
import pytest

from jaxrl_llm.data import make_task
from jaxrl_llm.data.environments import EnvironmentOutputError, PluginEnvTask, SingleTurnEnv, StepResult
from jaxrl_llm.rewards import addition_reward
from jaxrl_llm.rollout.types import RolloutBatch, SamplingParams
from jaxrl_llm.train.run import loop
from jaxrl_llm.train.learn.batch import build_sequences
from jaxrl_llm.train.sample.engines import engine_spec, make_engine
from jaxrl_llm.train.sample.episodes import EpisodeLimits, observation_text, run_episodes
from jaxrl_llm.train.sample.grading import grade
from jaxrl_llm.train.policy import encode_prompts, load_policy
from jaxrl_llm.train.plan import plan_run
from jaxrl_llm.train.run.run_state import make_learner
from jaxrl_llm.rewards import GraderPool
from tests.envs.scripted_engine import FAKE_LOGPROB, FakeScriptedEngine
from tests.train.tiny_run import model_metrics, tiny_config


@pytest.fixture(scope="module")
def policy(tiny_model_dir):  # noqa: F811
    return load_policy(tiny_model_dir)


def calculator_script(history: str) -> str:
    """Calls the calculator on the question, then answers with the tool's result."""
    results = re.findall(r"<result>(-?\d+)</result>", history)
    if results:
        return f"Answer: {results[-1]}"
    a, op, b = re.search(r"What is (\d+) ([-+*]) (\d+)\?", history).groups()
    return f"I will use the tool. <calc>{a} {op} {b}</calc>"


def binary_search_script(max_number: int):
    def script(history: str) -> str:
        low, high = 1, max_number
        for guess, hint in re.findall(r"(\d+)<\|im_end\|>\n<\|im_start\|>user\n(Higher|Lower)\.", history):
            low, high = (int(guess) + 1, high) if hint == "Higher" else (low, int(guess) - 1)
        return str((low + high) // 2)
    return script


def limits(**kw):
    return EpisodeLimits(**{"max_turns": 4, "max_tokens": 256, "turn_max_tokens": 64, "discount": 1.0, **kw})


def spans(mask):
    """[(start, end, value)] runs of equal mask values."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((start, i, mask[start]))
            start = i
    return out


def test_calculator_scripted_episode_reward_mask_and_tokens(policy):
    task = make_task("calculator_tool", digits=2)
    examples = task.examples("train", 3, seed=0)
    engine = FakeScriptedEngine(policy, calculator_script)
    batch = run_episodes(engine, policy, task, examples, 2, SamplingParams(seed=0), limits())
    np.testing.assert_array_equal(batch.rewards, np.ones((3, 2)))
    assert engine.calls == [6, 6]  # every turn of all 6 episodes in ONE generate call
    assert batch.metrics["episode_turns"] == 2 and batch.metrics["episode_tool_calls"] == 1
    assert batch.metrics["episode_tool_errors"] == 0 and batch.metrics["episode_truncated_by_limit"] == 0
    tok = policy.tokenizer
    for record, example in zip(batch.rollouts.records, [e for e in examples for _ in range(2)]):
        a, op, b = example.metadata["a"], example.metadata["op"], example.metadata["b"]
        call, answer = f"I will use the tool. <calc>{a} {op} {b}</calc>", f"Answer: {example.answer}"
        # The whole token sequence is the chat template's rendering of the dialogue.
        dialogue = [{"role": "user", "content": example.prompt}, {"role": "assistant", "content": call},
                    {"role": "user", "content": f"<result>{example.answer}</result>"},
                    {"role": "assistant", "content": answer}]
        rendered = policy.chat.render(dialogue, add_generation_prompt=False)
        full = np.concatenate([record.prompt_token_ids, record.completion_token_ids]).tolist()
        assert tok.decode(full, skip_special_tokens=False) == rendered.rstrip("\n")
        # Token by token: 1 exactly on the two policy turns (content + EOS), 0 on the observation.
        mask = record.loss_mask.tolist()
        runs = spans(mask)
        assert [v for _, _, v in runs] == [1.0, 0.0, 1.0]
        texts = [tok.decode(record.completion_token_ids[s:e].tolist(), skip_special_tokens=False) for s, e, _ in runs]
        assert texts == [call + "<|im_end|>", f"\n<|im_start|>user\n<result>{example.answer}</result><|im_end|>\n"
                         "<|im_start|>assistant\n", answer + "<|im_end|>"]
        for t, (token, m) in enumerate(zip(record.completion_token_ids, mask)):  # sampler logprobs: policy only
            assert record.sampler_logprobs[t] == (FAKE_LOGPROB if m else 0.0), (t, token)
        assert record.finish_reason == "stop"
    seq = build_sequences(batch.rollouts, completion_width=256)  # the learner's loss mask is the episodes'
    for i, record in enumerate(batch.rollouts.records):
        np.testing.assert_array_equal(seq.completion_mask[i, :record.num_completion_tokens], record.loss_mask)
        assert seq.completion_mask[i, record.num_completion_tokens:].sum() == 0


def test_guess_number_binary_search_scripted(policy):
    task = make_task("guess_number", max_number=10)
    examples = task.all_examples("train")
    engine = FakeScriptedEngine(policy, binary_search_script(10))
    batch = run_episodes(engine, policy, task, examples, 1, SamplingParams(seed=0), limits(max_turns=4))
    np.testing.assert_array_equal(batch.rewards, np.ones((len(examples), 1)))
    for record, example in zip(batch.rollouts.records, examples):  # turns of a hand-run binary search
        low, high, expected = 1, 10, 0
        while True:
            expected, guess = expected + 1, (low + high) // 2
            if guess == int(example.answer):
                break
            low, high = (guess + 1, high) if int(example.answer) > guess else (low, guess - 1)
        assert sum(v for _, _, v in spans(record.loss_mask.tolist())) == expected  # policy turns
        assert len(spans(record.loss_mask.tolist())) == 2 * expected - 1


def test_limits_and_discount(policy):
    task = make_task("guess_number", max_number=10)
    example = [e for e in task.all_examples("train") if e.answer != "1"][0]
    always_one = FakeScriptedEngine(policy, lambda history: "1")
    out = run_episodes(always_one, policy, task, [example], 1, SamplingParams(seed=0), limits(max_turns=3))
    assert out.rewards[0, 0] == 0 and out.metrics["episode_truncated_by_limit"] == 1
    assert out.metrics["episode_turns"] == 3 and out.rollouts.records[0].finish_reason == "length"
    # Token budget: two short turns and one observation do not fit in 8 tokens.
    tight = run_episodes(always_one, policy, task, [example], 1, SamplingParams(seed=0),
                         limits(max_turns=5, max_tokens=8))
    assert tight.metrics["episode_truncated_by_limit"] == 1 and tight.rollouts.records[0].num_completion_tokens <= 8
    calc = make_task("calculator_tool")
    discounted = run_episodes(FakeScriptedEngine(policy, calculator_script), policy, calc,
                              calc.examples("train", 2, seed=1), 1, SamplingParams(seed=0), limits(discount=0.5))
    np.testing.assert_allclose(discounted.returns, 0.5)  # reward 1 at the second turn: 0.5**1
    np.testing.assert_allclose(discounted.rewards, 1.0)  # solved: what is_correct judges
    assert calc.is_correct(discounted.rewards).all()


class FakeVersionBumpingEngine(FakeScriptedEngine):
    """The scripted policy, with new weights installed after every `generate` call (what a
    weight update between two turns of one episode would do); records carry the version."""

    def generate(self, prompts, n, params):
        out = super().generate(prompts, n, params)
        records = tuple(dataclasses.replace(r, weight_version=self.weight_version) for r in out.records)
        self.weight_version += 1
        return RolloutBatch(records, out.num_prompts, 1)


def test_an_episode_mixing_weight_versions_is_refused(policy):
    calc = make_task("calculator_tool")
    examples = calc.examples("train", 2, seed=1)
    steady = run_episodes(FakeScriptedEngine(policy, calculator_script), policy, calc, examples, 1,
                          SamplingParams(seed=0), limits())
    assert [r.weight_version for r in steady.rollouts.records] == [0, 0]
    engine = FakeVersionBumpingEngine(policy, calculator_script)
    engine.weight_version = 7
    with pytest.raises(RuntimeError, match="weight versions 7 and 8"):  # turn 1 by v7, turn 2 by v8
        run_episodes(engine, policy, calc, examples, 1, SamplingParams(seed=0), limits())
    engine = FakeVersionBumpingEngine(policy, lambda history: "1")
    engine.weight_version = 3  # one-turn episodes never mix: labelled with their one version
    guess = make_task("guess_number", max_number=10)
    one_turn = run_episodes(engine, policy, guess, guess.all_examples("train")[:2], 1, SamplingParams(seed=0),
                            limits(max_turns=1))
    assert [r.weight_version for r in one_turn.rollouts.records] == [3, 3]


class NaNRewardEnv:
    def reset(self, example):
        return example.prompt, {}

    def step(self, text):
        return StepResult("again", float("nan"), False)


def test_malformed_env_output_in_an_episode_names_the_environment(policy):
    task = PluginEnvTask(make_task("addition"), NaNRewardEnv)
    with pytest.raises(EnvironmentOutputError, match=r"test_episodes.NaNRewardEnv.step returned reward nan"):
        run_episodes(FakeScriptedEngine(policy, lambda h: "3"), policy, task, task.examples("train", 1, seed=0), 1,
                     SamplingParams(seed=0), limits())


def test_observation_text_is_the_chat_template_user_turn(policy):
    assert observation_text(policy, "Lower.", turn_closed=True) == \
        "\n<|im_start|>user\nLower.<|im_end|>\n<|im_start|>assistant\n"
    assert observation_text(policy, "Lower.", turn_closed=False).startswith("<|im_end|>\n<|im_start|>user")


def test_jax_sampler_multi_turn_logprobs_equal_the_learners(tiny_model_dir, tmp_path, policy):  # noqa: F811
    """A tiny random decoder plays guess-the-number for 3 turns (its replies hold no number,
    so every episode runs to the turn limit). The learner's pi_old, through the real batch
    packing and Learner, equals the sampler's mu on every policy token; the observation
    tokens are in the sequence but out of the mask."""
    cfg = tiny_config(tiny_model_dir, tmp_path, "task.name=guess_number", "rollout.max_tokens=96",
                      "task.turn_max_tokens=6", "task.max_turns=3")
    task = make_task("guess_number")
    examples = task.examples("train", 2, seed=0)
    import contextlib
    with contextlib.ExitStack() as stack:
        engine = make_engine(engine_spec(cfg), policy, policy.params, stack=stack)
        batch = run_episodes(engine, policy, task, examples, 2, SamplingParams(temperature=1.0, seed=5,
                                                                                max_tokens=6),
                             EpisodeLimits.of(cfg.task, cfg.rollout.max_tokens))
    records = batch.rollouts.records
    assert batch.metrics["episode_turns"] > 2 and batch.metrics["episode_observation_tokens"] > 10
    seq = build_sequences(batch.rollouts, completion_width=cfg.rollout.max_tokens)
    learner = make_learner(cfg, policy, plan_run(cfg).recipe)
    logp = np.asarray(learner.step_logprobs(learner.init(policy.params).params, seq).logp)
    for i, r in enumerate(records):
        m = r.loss_mask.astype(bool)
        assert 0 < m.sum() < m.size  # both policy and observation tokens
        np.testing.assert_allclose(logp[i, :r.num_completion_tokens][m], r.sampler_logprobs[m], atol=2e-5)
        assert np.all(r.sampler_logprobs[~m] == 0)
        np.testing.assert_array_equal(seq.completion_mask[i, :r.num_completion_tokens], r.loss_mask)


def test_single_turn_env_episodes_equal_the_batched_single_turn_path(tiny_model_dir, tmp_path, policy):  # noqa: F811
    """The one-turn case of the runner is the single-turn rollout: same tokens, log-probs, rewards."""
    import contextlib
    cfg = tiny_config(tiny_model_dir, tmp_path)
    base = make_task("addition")
    task = PluginEnvTask(base, lambda: SingleTurnEnv(addition_reward))
    examples = base.examples("train", 2, seed=3)
    params = SamplingParams(temperature=1.0, seed=11, max_tokens=6)
    with contextlib.ExitStack() as stack:
        engine = make_engine(engine_spec(cfg), policy, policy.params, stack=stack)
        episodes = run_episodes(engine, policy, task, examples, 3, params, EpisodeLimits(1, 6, 6))
        batched = engine.generate(encode_prompts(policy, examples), n=3, params=params)
        pool = stack.enter_context(GraderPool(num_workers=1, timeout_s=5))
        texts = [policy.tokenizer.decode([t for t in r.completion_token_ids.tolist() if t not in policy.eos_token_ids])
                 for r in batched.records]
        rewards = grade(pool, base, texts, examples, 3).rewards
    for got, want in zip(episodes.rollouts.records, batched.records):
        np.testing.assert_array_equal(got.prompt_token_ids, want.prompt_token_ids)
        np.testing.assert_array_equal(got.completion_token_ids, want.completion_token_ids)
        np.testing.assert_array_equal(got.sampler_logprobs, want.sampler_logprobs)
        assert got.loss_mask.all() and got.finish_reason == want.finish_reason
    np.testing.assert_array_equal(episodes.rewards, rewards)


@pytest.mark.slow  # ~50 s CPU (120 s wall under load): keeps make test near 30 min
def test_training_loop_runs_episodes_with_metrics_and_eval(tiny_model_dir, tmp_path):  # noqa: F811
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", "task.name=guess_number", "rollout.max_tokens=48",
                      "task.turn_max_tokens=4", "task.max_turns=2", "total_steps=1", "task.eval_every=1",
                      'task.kwargs={"max_number": 6}')
    result = loop.train(cfg)
    rows = model_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1]
    for row in rows:
        assert 1 <= row["episode_turns"] <= 2 and row["episode_observation_tokens"] > 0
        assert 0 <= row["episode_truncated_by_limit"] <= 1 and "episode_tool_errors" in row
    assert "eval_pass@1" in rows[-1] and result.step == 1


# |mean log mu - log pi_old| per token of the tiny fp32 multi-turn run: measured <= 8.4e-8 in 16
# runs under load (benchmarks/results/offset_trials.json); the offset seen once was ~1e-2.
MISMATCH_K1_BOUND = 1e-5


@pytest.mark.slow  # 78 s; make test resumes a multi-turn GEM run instead (tests/envs/test_gem_cli.py)
@pytest.mark.timeout(900)  # three tiny runs, ~2-3 min under load
def test_kill_9_then_resume_is_exact_for_a_multi_turn_run(tiny_model_dir, tmp_path):  # noqa: F811
    """A user environment named by task.env (two turns, parity rewards, so the policy moves),
    killed with SIGKILL after step 2 and resumed: every step's metrics equal an uninterrupted
    run's, and in both runs the sampler's log-probs equal the learner's within rounding
    (|mismatch_k1| <= MISMATCH_K1_BOUND per step).

    A ~0.01/token offset between sampler and learner log-probs was seen once (2026-11-23,
    load average ~20, on the straight run's steps 1-4 with identical tokens and rewards; the
    rerun passed), on JAX-sampler code since rewritten (inverse-CDF draw, one prefill per
    prompt, row compaction). Issue 35 tried to reproduce it with this run's configuration
    (jaxrl_llm/benchmarks/cpu/offset_trials.py, results in benchmarks/results/offset_trials.json): 16 runs,
    two at a time as here, at load averages of 13-23 on 2 cores plus a busy-loop burner, with
    8 or 1 fake devices and threaded or single-threaded XLA:CPU. No offset: |mismatch_k1| <=
    8.4e-8, every run bit-identical to the first of its condition (4 more runs of the 11-23
    code, 8 devices: the same, <= 7.2e-8); threading changed nothing,
    the device count changed values at the 1e-8 level (another SPMD program). Weights cannot
    change inside an episode (the producer holds the engine lock for a step's turns; mixing
    versions raises: test_an_episode_mixing_weight_versions_is_refused), and step 1 is
    sampled before any publish. So the offset is bounded, not explained: a recurrence fails
    the bound above naming the step and the value (the equality check alone says only that
    the runs differ, and passes if both are off alike)."""
    import signal

    from tests.train.tiny_run import REPO, TINY_OVERRIDES, run_cli
    from tests.train.kill_resume import kill_after_step

    common = ["--config", str(REPO / "experiments/demo.py"), *TINY_OVERRIDES, f"model.source={tiny_model_dir}",
              "task.env=tests.train.episode_envs:ParityEnv", 'task.env_kwargs={"turns": 2}', "rollout.max_tokens=48",
              "task.turn_max_tokens=5", "task.max_turns=2"]
    straight = run_cli("train", *common, f"run_dir={tmp_path / 'straight'}")
    victim = run_cli("train", *common, f"run_dir={tmp_path / 'crashed'}")
    kill_after_step(victim, tmp_path / "crashed" / "metrics.jsonl", 2)
    assert victim.returncode == -signal.SIGKILL
    resumed = run_cli("train", *common, f"run_dir={tmp_path / 'crashed'}", "--resume")
    assert resumed.wait(timeout=900) == 0, resumed.stdout.read()
    assert straight.wait(timeout=900) == 0, straight.stdout.read()
    expected, got = model_metrics(tmp_path / "straight"), model_metrics(tmp_path / "crashed")
    assert [row["step"] for row in got] == [1, 2, 3, 4]
    assert all(row["episode_turns"] > 1 and row["episode_observation_tokens"] > 0 for row in expected)
    assert 0 < expected[0]["reward"] < 2 and expected[-1]["grad_norm"] > 0  # the policy moves
    for row in expected + got:  # the sampler's mu and the learner's pi_old: the same fp32 function
        assert abs(row["mismatch_k1"]) <= MISMATCH_K1_BOUND, (row["step"], row["mismatch_k1"])
        assert max(-row["mismatch_prob_diff_min"], row["mismatch_prob_diff_max"]) <= MISMATCH_K1_BOUND, row["step"]
    for want, have in zip(expected, got):
        assert want.keys() == have.keys()
        for key in set(want) - {"time"}:  # "time": the wall clock of the log line
            np.testing.assert_equal(have[key], want[key], err_msg=f"step {want['step']} {key}")


def test_environment_config_errors_name_the_field(tmp_path):
    from jaxrl_llm.train.config import ConfigError
    from jaxrl_llm.train.config.checks import check_runnable
    from jaxrl_llm.train.sample.prompts import task_from_config
    from tests.train.tiny_run import REPO
    from jaxrl_llm.train.config import load_config

    def cfg(*overrides):
        return load_config(str(REPO / "experiments/demo.py"), ["rollout.engine=jax", f"run_dir={tmp_path}", *overrides])

    with pytest.raises(ConfigError, match=r"task.env_kwargs"):
        cfg("task.env_kwargs=[1]")
    with pytest.raises(ConfigError, match="task.env = 'no_such_module_xyz:Env': cannot import module"):
        task_from_config(cfg("task.env=no_such_module_xyz:Env"))
    with pytest.raises(ConfigError, match="task.env = 'not a spec' is invalid"):
        task_from_config(cfg("task.env=not a spec"))
    with pytest.raises(ConfigError, match=r"task.kwargs = \{'colour': 1\} is invalid: .*'guess_number'.*colour"):
        task_from_config(cfg("task.name=guess_number", 'task.kwargs={"colour": 1}'))
    with pytest.raises(ConfigError, match="dynamic_sampling is not supported with a multi-turn environment"):
        check_runnable(cfg("task.name=calculator_tool", "recipe.name=dapo"))
    task = task_from_config(cfg("task.env=tests.train.episode_envs:ParityEnv", 'task.env_kwargs={"turns": 3}'))
    assert isinstance(task, PluginEnvTask) and task.make_env().turns == 3 and task.name == "addition"
    assert task_from_config(cfg("task.name=guess_number", 'task.kwargs={"max_number": 7}')).max_number == 7


class FakeRoutingEngine(FakeScriptedEngine):
    """The scripted policy, with routed_experts as the sampler returns them (one row per forwarded
    token: prompt + completion - 1) from a made-up rule of (position, token): `fake_routing`."""

    def generate(self, prompts, n, params):
        out = super().generate(prompts, n, params)
        return RolloutBatch(tuple(dataclasses.replace(r, routed_experts=fake_routing(
            np.concatenate([r.prompt_token_ids, r.completion_token_ids])[:-1])) for r in out.records), len(prompts), 1)


def fake_routing(tokens):
    """[T, 2 layers, top-2] experts of 4 for tokens [T]: a function of position and token."""
    t = np.arange(len(tokens))[:, None, None]
    return ((tokens[:, None, None] + t + np.arange(2)[None, :, None] + np.arange(2)[None, None, :]) % 4).astype(np.int32)


def test_an_episode_record_carries_the_turns_routing(policy):
    """Routing replay: the episode's record holds routed_experts for all P + L - 1 tokens (the last
    turn's call forwarded the whole history), equal to the rule at every position; a turn without
    them leaves the record without."""
    calc = make_task("calculator_tool")
    examples = calc.examples("train", 2, seed=1)
    batch = run_episodes(FakeRoutingEngine(policy, calculator_script), policy, calc, examples, 1,
                         SamplingParams(seed=0), limits())
    for r in batch.rollouts.records:
        full = np.concatenate([r.prompt_token_ids, r.completion_token_ids])
        assert r.loss_mask.min() == 0  # a two-turn episode with an observation between the turns
        np.testing.assert_array_equal(r.routed_experts, fake_routing(full[:-1]))
    one_turn = run_episodes(FakeRoutingEngine(policy, calculator_script), policy, calc, examples, 1,
                            SamplingParams(seed=0), limits(max_turns=1, turn_max_tokens=4))  # a turn cut at 4 tokens
    for r in one_turn.rollouts.records:
        full = np.concatenate([r.prompt_token_ids, r.completion_token_ids])
        np.testing.assert_array_equal(r.routed_experts, fake_routing(full[:-1]))
    plain = run_episodes(FakeScriptedEngine(policy, calculator_script), policy, calc, examples, 1,
                         SamplingParams(seed=0), limits())
    assert all(r.routed_experts is None for r in plain.rollouts.records)
