"""VinePPO in the RL loop: Monte-Carlo values at chunk starts from extra rollouts.

Kazemnejad et al. 2024, "VinePPO: Unlocking RL Potential for LLM Reasoning Through Refined
Credit Assignment" (arXiv 2410.01679); the formulas are in core/vineppo.py and
docs/objectives.md#vineppo. Per step, after the responses are graded:

1. Chunk starts of every response (`core.chunk_starts`): every vineppo.chunk_tokens
   tokens, or after every token whose text holds a newline (vineppo.chunk=newline).
2. Prefixes: the prompt's token ids + the response's ids before each start. Identical
   prefixes of one prompt are asked once (the b = 0 state of all G responses of a prompt
   is the prompt itself, so V(prompt) is one estimate per prompt, not G).
3. ONE `engine.generate(prefixes, n=K, params)` call for all of them, token-id prompts,
   the rollouts' sampling parameters (temperature, top_p, top_k) and a seed derived from
   the step's. One call has one max_tokens: it is rollout.max_tokens (the budget of the
   b = 0 prefixes), and the continuation of a prefix that already holds b response tokens
   is cut to its remaining budget max_tokens - b. That cut is exact, not an approximation:
   sampling is autoregressive and max_tokens only stops it, so the first max_tokens - b
   tokens of a longer-budget sample are distributed as a sample with budget
   max_tokens - b (a cut continuation counts as truncated, as its rollout would). The price
   is the tokens sampled beyond a prefix's budget (counted in vineppo_extra_tokens).
4. Each continuation is graded as a whole response (prefix ids + continuation ids, decoded
   together) by the task's grader; V(prefix) = the mean of its K rewards
   (`core.mc_values`), V(end) = the response's own reward.
5. Token advantages A_t = V(next start) - V(this chunk's start)
   (`core.chunk_advantages`), handed to the learner as `Graded.extras["advantages"]`; the recipe's
   `core.MonteCarloAdvantage` places them (`core.StepInputs.extras["advantages"]`) and the
   PPO-clip loss takes them as any other advantages (no critic).

The loop runs this in the producer thread under the engine lock (`with_engine`), right
after grading, so the continuations come from the weights that drew the responses (the
config refuses rollout.max_lag > 0). Metrics per step: vineppo_prefixes (unique prefixes
asked), vineppo_extra_tokens (tokens the engine sampled for them), vineppo_seconds
(generate + grading), vineppo_chunks_mean (chunks per response), vineppo_value_prompt_mean.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, NamedTuple, Sequence

import numpy as np

from jaxrl_llm import core
from jaxrl_llm.data import Example
from jaxrl_llm.rollout.types import RolloutBatch, SamplingParams
from jaxrl_llm.train.config import VinePPOConfig

# Continuations are seeded apart from the step's rollouts (same step seed, other stream).
SEED_STREAM = 0x5EED


@dataclasses.dataclass(frozen=True)
class ChunkRule:
    """Where chunks start: every `every` tokens and/or after one of `newline_ids`."""

    every: int | None = None
    newline_ids: tuple[int, ...] = ()


class VineEstimate(NamedTuple):
    """The Monte-Carlo values of one step batch, [N, T_c] each (T_c = rollout.max_tokens)."""

    advantages: np.ndarray  # float32, 0 on padding
    start_values: np.ndarray  # float32: V at the chunk starts, 0 elsewhere
    starts: np.ndarray  # bool
    metrics: dict[str, float]


def newline_token_ids(tokenizer) -> tuple[int, ...]:
    """Ids of the vocabulary's tokens whose text contains a newline."""
    texts = tokenizer.decode_batch([[i] for i in range(tokenizer.get_vocab_size())])
    return tuple(i for i, text in enumerate(texts) if "\n" in text)


def chunk_rule(vine_cfg, tokenizer) -> ChunkRule:
    """The chunk rule of the config's vineppo section."""
    if vine_cfg.chunk == "newline":
        return ChunkRule(newline_ids=newline_token_ids(tokenizer))
    return ChunkRule(every=vine_cfg.chunk_tokens)


def continuation_seed(seed: int | None) -> int:
    """A seed for the continuations of the step whose rollouts used `seed`."""
    return int((0 if seed is None else seed) * 2654435761 + SEED_STREAM) % (2**31 - 1)


def response_arrays(rollouts: RolloutBatch, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(token ids int32 [N, width], mask float32 [N, width]) of the completions."""
    n = len(rollouts.records)
    tokens = np.zeros((n, width), np.int32)
    mask = np.zeros((n, width), np.float32)
    for i, rec in enumerate(rollouts.records):
        c = rec.num_completion_tokens
        tokens[i, :c] = rec.completion_token_ids
        mask[i, :c] = 1.0
    return tokens, mask


def estimate(engine, rollouts: RolloutBatch, rewards: np.ndarray, examples: Sequence[Example], *, k: int,
             rule: ChunkRule, params: SamplingParams, decode: Callable[[Sequence[int]], str],
             grade: Callable[[Sequence[str], Sequence[Example]], np.ndarray]) -> VineEstimate:
    """VinePPO values and advantages of a graded step batch (see the module doc).

    Args:
      engine: the rollout engine, holding the weights that drew `rollouts`.
      rollouts: P prompts x G samples, prompt-major.
      rewards: [P, G] the responses' own rewards (V after the last token).
      examples: the P examples (the graders' second argument).
      k: continuations per prefix.
      rule: where chunks start.
      params: the rollouts' sampling parameters (max_tokens = the responses' budget).
      decode: completion token ids -> text (EOS removed).
      grade: (texts, examples) -> float rewards [len(texts)].
    """
    t0 = time.perf_counter()
    group = rollouts.samples_per_prompt
    budget = params.max_tokens
    tokens, mask = response_arrays(rollouts, budget)
    starts = np.asarray(core.chunk_starts(tokens, mask, every=rule.every, newline_ids=rule.newline_ids))
    keys: dict[tuple, int] = {}  # (prompt index, response prefix) -> unique prefix index
    owner = np.full(starts.shape, -1, np.int64)
    for i, t in zip(*np.nonzero(starts)):
        key = (i // group, tuple(tokens[i, :t].tolist()))
        owner[i, t] = keys.setdefault(key, len(keys))
    prefixes = list(keys)
    if not prefixes:  # only empty responses: nothing to value
        zeros = np.zeros(starts.shape, np.float32)
        return VineEstimate(zeros, zeros, starts, {"vineppo_prefixes": 0.0, "vineppo_extra_tokens": 0.0,
                                                   "vineppo_seconds": time.perf_counter() - t0})
    prompts = [rollouts.records[p * group].prompt_token_ids.tolist() + list(ids) for p, ids in prefixes]
    out = engine.generate(prompts, n=k, params=dataclasses.replace(
        params, max_tokens=budget, seed=continuation_seed(params.seed), first_row=0))
    texts, graded_examples = [], []
    for rec in out.records:
        p, ids = prefixes[rec.prompt_index]
        cont = rec.completion_token_ids[:budget - len(ids)].tolist()  # the prefix's remaining budget
        texts.append(decode(list(ids) + cont))
        graded_examples.append(examples[p])
    cont_rewards = np.asarray(grade(texts, graded_examples), np.float32).reshape(len(prefixes), k)
    values = np.asarray(core.mc_values(cont_rewards)[0])
    start_values = np.where(starts, values[np.maximum(owner, 0)], 0.0).astype(np.float32)
    advantages = np.asarray(core.chunk_advantages(start_values, starts, np.asarray(rewards).reshape(-1), mask))
    n_starts = max(int(starts.sum()), 1)
    metrics = {"vineppo_prefixes": float(len(prefixes)),
               "vineppo_extra_tokens": float(sum(r.num_completion_tokens for r in out.records)),
               "vineppo_seconds": time.perf_counter() - t0,
               "vineppo_chunks_mean": n_starts / max(int((mask.sum(axis=1) > 0).sum()), 1),
               "vineppo_value_prompt_mean": float(start_values[:, 0][starts[:, 0]].mean())}
    return VineEstimate(advantages.astype(np.float32), start_values, starts, metrics)


@dataclasses.dataclass(frozen=True)
class VineValues:
    """What the loop's grading step needs to attach VinePPO advantages to a graded batch."""

    k: int
    rule: ChunkRule
    decode: Callable[[Sequence[int]], str]
    grade: Callable[[Sequence[str], Sequence[Example]], np.ndarray]

    def attach(self, engine, rollouts: RolloutBatch, graded, examples: Sequence[Example], params: SamplingParams):
        """`graded` (a grading.Graded) with the VinePPO advantages and metrics of `rollouts`."""
        out = estimate(engine, rollouts, graded.rewards, examples, k=self.k, rule=self.rule, params=params,
                       decode=self.decode, grade=self.grade)
        return dataclasses.replace(graded, extras={**graded.extras, "advantages": out.advantages},
                                   sampling={**graded.sampling, **out.metrics})


def vine_values(vineppo: VinePPOConfig, policy, task, pool) -> VineValues:
    """The sampling stage's VinePPO hook, for a run whose recipe estimates advantages by Monte
    Carlo (recipe.name=vineppo or recipe.advantage=vineppo; `RunPlan.vineppo`)."""
    import jax

    if jax.process_count() > 1:
        raise NotImplementedError("VinePPO in the RL loop runs in one JAX process (the step gather does not "
                                  "carry its advantages)")
    eos = set(policy.eos_token_ids)

    def decode(ids: Sequence[int]) -> str:
        return policy.tokenizer.decode([t for t in ids if t not in eos])

    def grade(texts: Sequence[str], examples: Sequence[Example]) -> np.ndarray:
        return np.asarray(pool.grade(task.reward_fn, list(texts), list(examples)).rewards, np.float32)

    return VineValues(vineppo.k, chunk_rule(vineppo, policy.tokenizer), decode, grade)
