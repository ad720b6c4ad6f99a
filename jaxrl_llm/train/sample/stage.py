"""The sampling stage of a step: produce the step's graded groups, one implementation per mode.

Every mode answers the same three questions for the rollout producer (`AsyncRolloutProducer`):

- `job(step)`: what to sample for a step: this process's share of the step's prompts (a pure
  function of (seed, step), so a resumed run sees the same prompts) and the sampling seed;
- `sample(engine, job)`: the step's rollouts, drawn while the producer holds the engine (so every
  record comes from one weight version), with their grades when the mode grades as it samples;
- `grade(job, rollouts, with_engine)`: the grades of rollouts sampled without them (a plain batch,
  or one replayed from a checkpoint), outside the engine's lock; `with_engine` runs a function on
  the engine between the producer's own uses of it.

Modes (`step_sampling` picks one from the run plan):

- `PlainBatch`: P prompts x G samples, graded after sampling; with VinePPO, K continuations per
  chunk start are drawn after grading, by the same weights (`vineppo_step`); with ReMax, the job
  also draws one greedy response per prompt (`StepPrompts.greedy`), kept as the last row of its
  group, graded with it and handed to the learner only as the baseline
  (`Graded.extras["baseline_rewards"]`); the other extras the recipe's estimator declares come
  from `extras.EXTRA_INPUTS` (`fill_extras`);
- `DynamicRounds`: DAPO's dynamic sampling, prompt rounds until the step holds P informative
  groups (`dynamic_sampling`), graded round by round;
- `Episodes`: multi-turn environments, the policy and the environment take turns (`episodes`).

Reward shaping (length rewards, DARLING; `shaping`) applies to every mode's grades.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from jaxrl_llm import core
from jaxrl_llm.data import TRAIN, Example, Task
from jaxrl_llm.rewards import GraderPool
from jaxrl_llm.rollout.types import RolloutBatch, SamplingParams
from jaxrl_llm.train import distributed
from jaxrl_llm.train.sample import vineppo_step
from jaxrl_llm.train.sample.async_rollout import RolloutJob
from jaxrl_llm.train.config import Config
from jaxrl_llm.train.sample.dynamic_sampling import SampledRound, round_seed, sample_until_full
from jaxrl_llm.train.sample.engines import sampling_params
from jaxrl_llm.train.sample.extras import fill_extras
from jaxrl_llm.train.sample.episodes import EpisodeLimits, run_episodes
from jaxrl_llm.train.sample.grading import Graded, grade, learner_rollouts
from jaxrl_llm.train.policy import Policy, decode_completions, encode_prompts
from jaxrl_llm.train.sample.prompts import step_seed
from jaxrl_llm.train.plan import RunPlan
from jaxrl_llm.train.sample.shaping import shape_rewards, with_length_targets

WithEngine = Callable[[Callable[[Any], Any]], Any]


@dataclasses.dataclass(frozen=True)
class StepPrompts:
    """What a step's rollout job carries to its consumer: this process's examples, the longest
    prompt of the whole step (the gather pads to it), and each prompt round's share."""

    examples: Sequence[Example]
    prompt_width: int
    rounds: tuple = ()  # (examples, encoded prompts) of this process's share, per round
    greedy: SamplingParams | None = None  # ReMax: one greedy response per prompt with these params


class StepSampling:
    """The shared part of every mode: a step's job, and the shaping of grades."""

    def __init__(self, cfg: Config, plan: RunPlan, policy: Policy, task: Task, pool: GraderPool):
        self.cfg, self.plan, self.policy, self.task, self.pool = cfg, plan, policy, task, pool
        self.block = distributed.process_prompt_block(cfg.rollout.prompts_per_step)

    def job(self, step: int) -> RolloutJob:
        """This process's share of step `step`'s prompts, for every prompt round of the plan."""
        cfg, block, group = self.cfg, self.block, self.cfg.rollout.samples_per_prompt
        seeds = [round_seed(step_seed(cfg.seed, step), r) for r in range(self.plan.sampling_rounds)]
        drawn = [with_length_targets(cfg.shaping, self.task.examples(TRAIN, cfg.rollout.prompts_per_step, seed=seed),
                                     seed) for seed in seeds]  # round 0 = prompts.step_examples(task, step, ...)
        encoded = [encode_prompts(self.policy, examples) for examples in drawn]
        params = dataclasses.replace(sampling_params(cfg.rollout, seed=step_seed(cfg.seed, step)),
                                     first_row=block.start * group)  # the samples of an unsplit batch
        width = max(len(p) for prompts in encoded for p in prompts)
        greedy = dataclasses.replace(params, temperature=0.0, first_row=block.start) if self.plan.greedy_baseline else None
        return RolloutJob(step, encoded[0][block], group, params, StepPrompts(
            drawn[0][block], width, tuple((e[block], p[block]) for e, p in zip(drawn, encoded)), greedy))

    def sample(self, engine, job: RolloutJob) -> tuple[RolloutBatch, Graded | None]:
        raise NotImplementedError

    def grade(self, job: RolloutJob, rollouts: RolloutBatch, with_engine: WithEngine) -> Graded:
        raise NotImplementedError(f"{type(self).__name__} grades as it samples; its batches are not replayed")

    def shaped(self, graded: Graded, rollouts: RolloutBatch, examples: Sequence[Example],
               texts: Sequence[str] | None = None) -> Graded:
        """`graded` with the learner's rewards shaped (`shaping.shape_rewards`) and its metrics;
        `texts`: the decoded completions, when the caller has them."""
        texts = decode_completions(self.policy, rollouts) if texts is None else texts
        lengths = np.array([r.num_completion_tokens for r in rollouts.records]).reshape(graded.rewards.shape)
        out = shape_rewards(self.cfg.shaping, self.task, graded.rewards, texts, lengths, examples,
                            base=graded.learner_rewards)
        return dataclasses.replace(graded, shaped=out.rewards, sampling={**graded.sampling, **out.metrics})


class PlainBatch(StepSampling):
    """P prompts x G samples in one `generate`, graded afterwards (outside the engine's lock)."""

    def __init__(self, cfg: Config, plan: RunPlan, policy: Policy, task: Task, pool: GraderPool):
        super().__init__(cfg, plan, policy, task, pool)
        self.vine = vineppo_step.vine_values(cfg.vineppo, policy, task, pool) if plan.vineppo else None

    def sample(self, engine, job: RolloutJob) -> tuple[RolloutBatch, None]:
        rollouts = engine.generate(job.prompts, n=job.n, params=job.params)
        if job.context.greedy is None:
            return rollouts, None
        return with_greedy_rows(rollouts, engine.generate(job.prompts, n=1, params=job.context.greedy)), None

    def grade(self, job: RolloutJob, rollouts: RolloutBatch, with_engine: WithEngine) -> Graded:
        examples, texts = job.context.examples, decode_completions(self.policy, rollouts)
        graded = grade(self.pool, self.task, texts, examples, rollouts.samples_per_prompt)
        if rollouts.samples_per_prompt > job.n:  # ReMax: the last row of each group is the greedy one
            graded = greedy_baseline(graded, job.n)
            rollouts = learner_rollouts(rollouts, graded)
            texts = [t for i, t in enumerate(texts) if i % (job.n + 1) < job.n]
        graded = self.shaped(graded, rollouts, examples, texts)
        if self.vine is not None:  # K continuations per chunk start, by the weights that drew `rollouts`
            graded = with_engine(lambda engine: self.vine.attach(engine, rollouts, graded, examples, job.params))
        return fill_extras(graded, rollouts, core.estimator_inputs(self.plan.recipe))


class DynamicRounds(StepSampling):
    """DAPO's dynamic sampling: rounds of the step's prompt draws, graded as they come, until the
    step holds P groups whose accuracy is neither 0 nor 1 (`dynamic_sampling.sample_until_full`)."""

    def sample(self, engine, job: RolloutJob) -> tuple[RolloutBatch, Graded]:
        def one_round(r: int) -> SampledRound:
            examples, prompts = job.context.rounds[r]
            rollouts = engine.generate(prompts, n=job.n, params=dataclasses.replace(
                job.params, seed=round_seed(job.params.seed, r)))
            graded = grade(self.pool, self.task, decode_completions(self.policy, rollouts), examples, job.n)
            return SampledRound(rollouts, graded.rewards, graded)

        filled, drawn = sample_until_full(one_round, self.task.is_correct, max_rounds=self.plan.sampling_rounds)
        graded = Graded(filled.rewards, sum(r.extra.errors for r in drawn), sum(r.extra.timeouts for r in drawn),
                        sum(r.extra.wall_s for r in drawn), filled.metrics,
                        forgery_suspected=sum(r.extra.forgery_suspected for r in drawn))
        examples = [job.context.rounds[r][0][p] for r, p in filled.source]
        return filled.rollouts, self.shaped(graded, filled.rollouts, examples)


class Episodes(StepSampling):
    """Multi-turn environments (`episodes.run_episodes`): the episodes' summed rewards are judged
    for correctness, their discounted returns are the learner's rewards."""

    def __init__(self, cfg: Config, plan: RunPlan, policy: Policy, task: Task, pool: GraderPool):
        super().__init__(cfg, plan, policy, task, pool)
        self.limits = EpisodeLimits.of(cfg.task, cfg.rollout.max_tokens)

    def sample(self, engine, job: RolloutJob) -> tuple[RolloutBatch, Graded]:
        batch = run_episodes(engine, self.policy, self.task, job.context.examples, job.n, job.params, self.limits)
        graded = Graded(batch.rewards, 0, 0, batch.wall_s, batch.metrics, shaped=batch.returns)
        return batch.rollouts, self.shaped(graded, batch.rollouts, job.context.examples)


def with_greedy_rows(rollouts: RolloutBatch, greedy: RolloutBatch) -> RolloutBatch:
    """`rollouts` (P x G) with each prompt's greedy response appended to its group (P x (G + 1))."""
    group = rollouts.samples_per_prompt
    records = []
    for p in range(rollouts.num_prompts):
        records += rollouts.records[p * group:(p + 1) * group]
        records.append(dataclasses.replace(greedy.records[p], prompt_index=p, sample_index=group))
    return RolloutBatch(tuple(records), rollouts.num_prompts, group + 1)


def greedy_baseline(graded: Graded, group: int) -> Graded:
    """Grades of P x (G + 1) rows split into the G sampled rows' and the greedy row's, ReMax's
    baseline (`core.GreedyBaselineAdvantage`'s extra "baseline_rewards" [P])."""
    return dataclasses.replace(
        graded, rewards=graded.rewards[:, :group],
        extras={**graded.extras, "baseline_rewards": graded.rewards[:, group]},
        parts={name: r[:, :group] for name, r in graded.parts.items()},
        sampling={**graded.sampling, "baseline_reward": float(np.mean(graded.rewards[:, group]))})


def step_sampling(cfg: Config, plan: RunPlan, policy: Policy, task: Task, pool: GraderPool) -> StepSampling:
    """The sampling mode of the run plan."""
    mode = DynamicRounds if plan.dynamic_sampling else Episodes if plan.env_task else PlainBatch
    return mode(cfg, plan, policy, task, pool)
