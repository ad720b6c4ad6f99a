"""Multi-turn episodes: the policy and an environment take turns, on either rollout engine.

Each episode is one :class:`~jaxrl_llm.data.environments.Environment` instance. Its
token history is

    prompt (the reset observation as chat-template turns: a str is one user turn)
    | policy turn 1 | observation 1 | policy turn 2 | observation 2 | ...

and becomes ONE `RolloutRecord`: `prompt_token_ids` = the prompt, `completion_token_ids`
= everything after it, with `loss_mask` 1 on the policy's tokens and 0 on the
observations (which sit in the sequence, so later turns attend to them, but are not
actions of the policy). Token accounting is exact: the policy's sampled ids are appended
verbatim (never decoded and re-encoded), and the sampler's log-probs are kept for those
tokens only (0 on observations), so the learner scores exactly the ids the sampler drew
at the same positions.

Every turn, the next turns of all running episodes go to the engine in one `generate`
call (prompts = each episode's full token history, one sample each). An observation is
rendered as the chat template's "end of assistant turn, user turn, assistant header"
text (`observation_ids`), so the concatenation is what the chat template would render
for the whole dialogue.

Limits: `max_turns` policy turns, and a budget of `max_tokens` completion tokens per
episode (policy + observations; it is the learner's completion width, rollout.max_tokens).
An episode that hits either before the environment ends it is cut ("truncated by limit",
finish_reason "length"); finish_reason is "stop" only when the environment terminated the
episode after a policy turn that ended with its own end-of-turn token (as a single-turn
sample is "stop" only when it ended with EOS). The episode's reward is the discounted sum of its step rewards,
sum_t discount**t r_t (t counts policy turns from 0).

Routing (MoE policies, routing replay): each turn's call forwards the whole history, so its record's
routed_experts cover every position before its last sampled token; the episode keeps the latest
turn's rows and its record gets them padded with -1 (no record: the learner's own top-k) to
P + L - 1 rows, i.e. the observation after the last turn and the last token have none. A turn
without routed_experts leaves the episode without them.

Versions: an episode's record carries the weight version that sampled its turns; all its
turns must come from one version (the training loop's producer holds the engine, and so
its weights, for the whole batch), else `run_episodes` raises instead of mixing policies.

Seeds: turn 0 samples with the step's seed, exactly as a single-turn rollout would, and
turn t > 0 with a seed derived from (seed, t); sampling is a pure function of the step's
seed and the weights, so a resumed run replays its episodes exactly.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import numpy as np

from jaxrl_llm.data import Example
from jaxrl_llm.data.environments import EnvTask, checked_reset, checked_step
from jaxrl_llm.rollout.types import RolloutBatch, RolloutRecord, SamplingParams
from jaxrl_llm.train.config import TaskConfig
from jaxrl_llm.train.policy import Policy

_TURN_END_MARK = "\u2063TURN-END\u2063"  # an assistant message no template alters


@dataclasses.dataclass(frozen=True)
class EpisodeLimits:
    """Turn and token limits of an episode, and the reward discount."""

    max_turns: int
    max_tokens: int  # completion tokens per episode, policy + observations
    turn_max_tokens: int  # tokens per policy turn
    discount: float = 1.0

    @classmethod
    def of(cls, task: TaskConfig, max_tokens: int) -> "EpisodeLimits":
        """The limits of the task section, with `max_tokens` (rollout.max_tokens) per episode."""
        return cls(task.max_turns, max_tokens, min(task.turn_max_tokens or max_tokens, max_tokens), task.discount)


@dataclasses.dataclass(frozen=True)
class EpisodeBatch:
    """P prompts x G episodes: one record each (prompt-major), the summed step rewards [P, G]
    (what `task.is_correct` judges: a solved episode is correct whatever its turn), the
    discounted returns [P, G] (what the learner maximises) and the per-episode means of turns,
    tool calls, tool errors and truncation by limit."""

    rollouts: RolloutBatch
    rewards: np.ndarray
    returns: np.ndarray
    metrics: dict[str, float]
    wall_s: float


@dataclasses.dataclass
class _Episode:
    env: Any
    prompt: list[int]
    tokens: list[int] = dataclasses.field(default_factory=list)
    mask: list[float] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    rewards: list[float] = dataclasses.field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0
    done: bool = False
    finish_reason: str = "length"
    truncated_by_limit: bool = False
    weight_version: int | None = None  # of the first turn; every later turn must match it
    routing: np.ndarray | None = None  # [rows, nL, k]: the latest turn's routed_experts of the history's positions
    routing_missing: bool = False  # a turn came without routed_experts

    def take_routing(self, rec: RolloutRecord, history: int) -> None:
        """Keeps ``rec``'s routed_experts of the first ``history`` positions (the tokens kept so far)."""
        if rec.routed_experts is None:
            self.routing_missing = True
        else:
            self.routing = rec.routed_experts[:history]

    def record_routing(self) -> np.ndarray | None:
        """routed_experts of the episode's record: [P + L - 1, nL, k], -1 where no turn forwarded the token."""
        if self.routing_missing or self.routing is None:
            return None
        rows = len(self.prompt) + len(self.tokens) - 1
        out = np.full((rows, *self.routing.shape[1:]), -1, np.int32)
        out[:min(rows, len(self.routing))] = self.routing[:rows]
        return out

    def append(self, ids, logprobs, policy: bool) -> None:
        self.tokens += [int(t) for t in ids]
        self.mask += [1.0 if policy else 0.0] * len(ids)
        self.logprobs += [float(x) for x in logprobs] if policy else [0.0] * len(ids)


def chat_turns(observation: str | list[dict]) -> list[dict]:
    """An observation as chat messages: a str is one user turn."""
    return [{"role": "user", "content": observation}] if isinstance(observation, str) else list(observation)


def observation_text(policy: Policy, observation: str | list[dict], *, turn_closed: bool) -> str:
    """The text between a policy turn and the next one: the end of the assistant turn, the
    observation's turns (a str: one user turn), and the assistant header, as the chat template renders them.
    `turn_closed`: the policy's turn already ends with the end-of-turn (EOS) token, whose
    text is then left out here."""
    rendered = policy.chat.render([{"role": "user", "content": "x"}, {"role": "assistant", "content": _TURN_END_MARK},
                                   *chat_turns(observation)], add_generation_prompt=True)
    text = rendered[rendered.index(_TURN_END_MARK) + len(_TURN_END_MARK):]
    eos = policy.chat.special_tokens.get("eos_token")
    if turn_closed and eos and text.startswith(eos):
        text = text[len(eos):]
    return text


def observation_ids(policy: Policy, observation: str | list[dict], *, turn_closed: bool) -> list[int]:
    return policy.tokenizer.encode(observation_text(policy, observation, turn_closed=turn_closed),
                                   add_special_tokens=False).ids


def turn_seed(seed: int | None, turn: int) -> int | None:
    """Turn 0 keeps the step's seed (a single-turn rollout's); later turns derive theirs."""
    if seed is None or turn == 0:
        return seed
    return int(np.random.SeedSequence([int(seed), turn]).generate_state(1)[0] & 0x7FFFFFFF)


def run_episodes(engine, policy: Policy, task: EnvTask, examples: Sequence[Example], n: int,
                 params: SamplingParams, limits: EpisodeLimits) -> EpisodeBatch:
    """n episodes per example, all turns batched per call (see the module docstring)."""
    t0 = time.perf_counter()
    episodes = []
    for example in examples:
        for _ in range(n):
            env = task.make_env()
            observation, _ = checked_reset(env, example)
            prompt = policy.tokenizer.encode(policy.chat.render(chat_turns(observation), add_generation_prompt=True),
                                             add_special_tokens=False).ids
            episodes.append(_Episode(env, prompt))
    eos = set(policy.eos_token_ids)
    for turn in range(limits.max_turns):
        active = [e for e in episodes if not e.done]
        if not active:
            break
        budget = max(limits.max_tokens - len(e.tokens) for e in active)
        call = dataclasses.replace(params, seed=turn_seed(params.seed, turn),
                                   max_tokens=min(limits.turn_max_tokens, budget))
        out = engine.generate([e.prompt + e.tokens for e in active], n=1, params=call)
        for e, rec in zip(active, out.records):
            _play_turn(e, rec, policy, eos, limits, last_turn=turn == limits.max_turns - 1)
    return _batch(episodes, len(examples), n, limits, time.perf_counter() - t0)


def _play_turn(e: _Episode, rec: RolloutRecord, policy: Policy, eos: set[int], limits: EpisodeLimits, *,
               last_turn: bool) -> None:
    room = limits.max_tokens - len(e.tokens)
    ids, logprobs = rec.completion_token_ids[:room], rec.sampler_logprobs[:room]
    if e.weight_version is not None and rec.weight_version != e.weight_version:
        raise RuntimeError(f"an episode's turns were sampled by weight versions {e.weight_version} and "
                           f"{rec.weight_version}; the engine's weights must not change during run_episodes "
                           "(the training loop holds the engine for the whole batch of episodes)")
    e.append(ids, logprobs, policy=True)
    e.take_routing(rec, len(e.prompt) + len(e.tokens))
    e.weight_version = rec.weight_version
    closed = rec.finish_reason == "stop" and len(ids) == rec.num_completion_tokens
    text = policy.tokenizer.decode([t for t in ids.tolist() if t not in eos])
    result = checked_step(e.env, text)
    e.rewards.append(result.reward)
    e.tool_calls += bool(result.info.get("tool_call"))
    e.tool_errors += bool(result.info.get("tool_error"))
    if result.terminated or result.truncated:  # "stop": the env ended it after a complete policy turn
        e.done, e.finish_reason = True, "stop" if result.terminated and closed else "length"
        return
    observation = observation_ids(policy, result.observation, turn_closed=closed)
    if last_turn or len(e.tokens) + len(observation) >= limits.max_tokens:
        e.done, e.truncated_by_limit = True, True  # no room (or no turn) left for the policy's next turn
        return
    e.append(observation, None, policy=False)


def _batch(episodes: list[_Episode], num_prompts: int, n: int, limits: EpisodeLimits, wall_s: float) -> EpisodeBatch:
    records = tuple(RolloutRecord(
        prompt_index=i // n, sample_index=i % n, prompt_token_ids=e.prompt, completion_token_ids=e.tokens,
        sampler_logprobs=e.logprobs, finish_reason=e.finish_reason, weight_version=e.weight_version,
        loss_mask=e.mask, routed_experts=e.record_routing()) for i, e in enumerate(episodes))
    rewards = np.array([sum(e.rewards) for e in episodes], np.float32)
    returns = np.array([sum(r * limits.discount**t for t, r in enumerate(e.rewards)) for e in episodes], np.float32)
    mean = lambda values: float(np.mean(values))  # noqa: E731
    metrics = {"episode_turns": mean([len(e.rewards) for e in episodes]),
               "episode_tool_calls": mean([e.tool_calls for e in episodes]),
               "episode_tool_errors": mean([e.tool_errors for e in episodes]),
               "episode_truncated_by_limit": mean([e.truncated_by_limit for e in episodes]),
               "episode_policy_tokens": mean([sum(e.mask) for e in episodes]),
               "episode_observation_tokens": mean([len(e.mask) - sum(e.mask) for e in episodes])}
    return EpisodeBatch(RolloutBatch(records, num_prompts, n), rewards.reshape(num_prompts, n),
                        returns.reshape(num_prompts, n), metrics, wall_s)
