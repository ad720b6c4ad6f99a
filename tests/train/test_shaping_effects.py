"""Run-level effects of the shaping methods (JAX sampler, same seed for the runs compared):
the overlong penalty shortens answers under a tight cap relative to the same run without
it; the L1 reward brings lengths towards the stated targets; DARLING keeps at least as
many distinct correct answers per group as GRPO on a task with many correct answers.

Fast versions run a tiny random decoder built to stop early (its answers have lengths
from 1 to the cap, so length is something it can learn); the `slow` ones run
SmolLM2-135M-Instruct (several minutes each on 2 CPU cores)."""
import numpy as np
import pytest

from jaxrl_llm.data import Example, Task
from jaxrl_llm.rewards import extract_integer_answer
from jaxrl_llm.train.run import loop
from jaxrl_llm.train.config import load_config
from jaxrl_llm.train.run.metrics import read_metrics
from jaxrl_llm.train.policy import load_policy
from tests.train.tiny_run import REPO, late, tiny_run



@pytest.mark.slow
def test_overlong_penalty_shortens_a_tiny_models_answers(stopping_model_dir, tmp_path):
    common = ["rollout.max_tokens=8", "recipe.name=grpo"]
    plain = tiny_run(stopping_model_dir, tmp_path / "plain", *common)
    penalised = tiny_run(stopping_model_dir, tmp_path / "penalised", *common, "recipe.overlong_buffer=8")
    assert plain[0]["length_mean"] == penalised[0]["length_mean"]  # step 1: the same samples
    print("length_mean plain", [r["length_mean"] for r in plain], "penalised", [r["length_mean"] for r in penalised])
    assert late(penalised, "length_mean") < late(plain, "length_mean") - 0.3


@pytest.mark.slow
def test_l1_reward_brings_a_tiny_models_lengths_to_the_target(stopping_model_dir, tmp_path):
    # the target is the cap: a policy that rarely stops (lengths ~4 at the start) must learn not to
    rows = tiny_run(stopping_model_dir, tmp_path / "l1", "rollout.max_tokens=12", "shaping.length_reward=l1",
                    "shaping.l1_targets=[12]", "shaping.length_reward_weight=0.1")
    errors = [r["l1_length_error"] for r in rows]
    print("l1_length_error", errors)
    assert np.mean(errors[-2:]) < 0.5 * np.mean(errors[:2])

@pytest.mark.slow
def test_l1_reward_with_a_short_target_shortens_a_tiny_models_answers(stopping_model_dir, tmp_path):
    # target 2 well below the cap 16: answers of ~4.5 tokens (1 to 12) must get shorter
    rows = tiny_run(stopping_model_dir, tmp_path / "l1_short", "rollout.max_tokens=16", "shaping.length_reward=l1",
                    "shaping.l1_targets=[2]", "shaping.length_reward_weight=0.1")
    errors, lengths = [r["l1_length_error"] for r in rows], [r["length_mean"] for r in rows]
    print("l1_length_error", errors, "length_mean", lengths)
    assert np.mean(errors[:2]) > 1.5  # the start is far from the target
    assert np.mean(errors[-2:]) < 0.75 * np.mean(errors[:2])  # measured: 2.83 -> 1.70
    assert np.mean(lengths[-2:]) < np.mean(lengths[:2])  # by shortening (4.39 -> 3.27), not lengthening


SMALL = ["rollout.engine=jax", "model.source=smollm2", "rollout.prompts_per_step=4", "rollout.samples_per_prompt=4",
         "train.micro_batch_size=8", "train.lr=3e-5", "checkpoint.every_steps=0", "checkpoint.async_save=false",
         "metrics.tensorboard=false", "task.eval_size=4"]


@pytest.fixture(scope="module")
def smollm2():
    return load_policy("smollm2")


def run(tmp_path, name: str, policy, *overrides: str, task=None) -> list[dict]:
    cfg = load_config(str(REPO / "experiments/demo.py"), [*SMALL, f"run_dir={tmp_path / name}", *overrides])
    loop.train(cfg, policy=policy, task=task)
    return read_metrics(cfg.run_path)


@pytest.mark.slow
def test_overlong_penalty_shortens_answers_under_a_tight_cap(tmp_path, smollm2):
    common = ["total_steps=6", "rollout.max_tokens=16", "recipe.name=dr_grpo"]
    plain = run(tmp_path, "plain", smollm2, *common)
    penalised = run(tmp_path, "penalised", smollm2, *common, "recipe.overlong_buffer=12")
    assert plain[0]["length_mean"] == penalised[0]["length_mean"]  # step 1: the same samples
    print("length_mean plain", [r["length_mean"] for r in plain], "penalised", [r["length_mean"] for r in penalised])
    assert late(penalised, "length_mean") < late(plain, "length_mean")


@pytest.mark.slow
def test_l1_reward_brings_lengths_towards_the_targets(tmp_path, smollm2):
    rows = run(tmp_path, "l1", smollm2, "total_steps=6", "rollout.max_tokens=16", "shaping.length_reward=l1",
               "shaping.l1_targets=[2,3]", "shaping.length_reward_weight=0.1")
    errors = [r["l1_length_error"] for r in rows]
    print("l1_length_error", errors)
    assert np.mean(errors[-2:]) < np.mean(errors[:2])


def any_even_number(completion: str, example) -> float:
    """1 for any even integer from 2 to 98."""
    value = extract_integer_answer(completion)
    return float(value is not None and 2 <= value <= 98 and value % 2 == 0)


class AnyEvenNumberTask(Task):
    """A task with many correct answers: "Name an even number between 1 and 99."."""

    name = "any_even_number"
    reward_fn = staticmethod(any_even_number)
    heldout_fraction = 0.5

    def examples(self, split, n, *, seed, unique=False):
        self._check_request(split, n)
        return [Example(f"{split}{seed}_{i}", self.name, "Name an even number between 1 and 99. Answer with just "
                        "the number.", "", split) for i in range(n)]


@pytest.mark.slow
def test_darling_keeps_more_distinct_correct_answers_than_grpo(tmp_path, smollm2):
    common = ["total_steps=6", "rollout.max_tokens=8", "recipe.name=grpo", "rollout.samples_per_prompt=8",
              "train.micro_batch_size=16"]
    grpo = run(tmp_path, "grpo", smollm2, *common, task=AnyEvenNumberTask())
    darling = run(tmp_path, "darling", smollm2, *common, "shaping.darling=answer", task=AnyEvenNumberTask())
    print("distinct_correct grpo", [r["distinct_correct"] for r in grpo],
          "darling", [r["distinct_correct"] for r in darling])
    assert grpo[0]["distinct_correct"] == darling[0]["distinct_correct"]  # step 1: the same samples
    # Strict: the runs share seeds, so a DARLING that changed nothing would tie.
    assert late(darling, "distinct_correct") > late(grpo, "distinct_correct")
