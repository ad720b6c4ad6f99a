"""The length-bias mechanism study's machinery (experiments/length_mechanism.py drives it):
a length-neutral task, a tiny decoder trained on it from scratch, its sampler and an RL loop
through the real learner that measures the stop probability and the stop-logit force of
every step, next to their closed form (reports/length_drift.py).

The task: a prompt token, then ONE answer token graded alone (RIGHT = 1, anything else
= 0), then free filler tokens until EOS. The policy: `models.config.tiny_decoder_config`
with a 16-token vocabulary, trained by supervised learning on that format with
P(answer = RIGHT) = `right_prob` and a stop probability `stop_prob` at every free position
(`supervised_start`). `run_recipe` trains it with the recipe's Learner (train/learner.py)
on samples of the decoder itself at temperature 1, the answer token left out of the loss
mask, so only the free part (the length) is trained.
"""
from __future__ import annotations

import dataclasses
import functools
import time

import numpy as np

from jaxrl_llm.reports import length_drift

RECIPES = ("grpo", "dr_grpo", "dapo")
PAD, EOS = 0, 1
NUM_PROMPTS = 4
PROMPT0 = 2  # prompt tokens 2..5
RIGHT, WRONG = 6, 7
FILLER0, NUM_FILLERS = 8, 8  # filler tokens 8..15
VOCAB = FILLER0 + NUM_FILLERS


@dataclasses.dataclass(frozen=True)
class MechanismStudy:
    """The study's size and its supervised start (the defaults: the full size)."""

    seeds: int = 10
    steps: int = 80
    samples: int = 8  # per prompt; every step uses all NUM_PROMPTS prompts
    max_tokens: int = 12  # answer + up to 11 free tokens
    stop_prob: float = 0.2  # q0 of the supervised start
    right_prob: float = 0.5
    lr: float = 1e-3
    sft_steps: int = 400
    eval_fillers: int = 4  # filler strings the stop probability is measured on


def model_config():
    """The tiny decoder of the tests (`tiny_decoder_config`) with this task's 16-token vocabulary."""
    from jaxrl_llm.models.config import tiny_decoder_config

    return tiny_decoder_config(vocab_size=VOCAB, tie_word_embeddings=False, rms_norm_eps=1e-6,
                               max_position_embeddings=64)


# ------------------------------------------------------------------ the start
def sft_data(rng: np.random.Generator, n: int, study: MechanismStudy) -> np.ndarray:
    """[n, 1 + max_tokens] sequences of the format: prompt, answer, fillers, EOS, padding."""
    free = study.max_tokens - 1
    tokens = np.full((n, 1 + study.max_tokens), PAD, np.int32)
    tokens[:, 0] = PROMPT0 + rng.integers(0, NUM_PROMPTS, n)
    tokens[:, 1] = np.where(rng.random(n) < study.right_prob, RIGHT, WRONG)
    stops = np.minimum(rng.geometric(study.stop_prob, n), free + 1)  # > free: truncated
    for i, j in enumerate(stops):
        fillers = FILLER0 + rng.integers(0, NUM_FILLERS, min(j - 1, free))
        tokens[i, 2:2 + fillers.size] = fillers
        if j <= free:
            tokens[i, 1 + j] = EOS
    return tokens


def supervised_start(seed: int, study: MechanismStudy):
    """A tiny decoder trained from scratch on `sft_data` (cross-entropy on the completion)."""
    import jax
    import jax.numpy as jnp
    import optax

    from jaxrl_llm.models import forward, init_params

    cfg = model_config()
    params = init_params(cfg, jax.random.key(seed))
    opt = optax.adam(3e-3)
    rng = np.random.default_rng(10_000 + seed)

    @jax.jit
    def step(params, state, tokens):
        def loss(params):
            logits, _ = forward(params, cfg, tokens, attention_mask=jnp.ones_like(tokens))
            logp = jax.nn.log_softmax(logits[:, :-1])
            target = tokens[:, 1:]
            nll = -jnp.take_along_axis(logp, target[..., None], axis=-1)[..., 0]
            mask = target != PAD  # the completion up to and including EOS (padding only after it)
            return jnp.sum(nll * mask) / jnp.sum(mask)

        value, grads = jax.value_and_grad(loss)(params)
        updates, state = opt.update(grads, state)
        return optax.apply_updates(params, updates), state, value

    state = opt.init(params)
    for _ in range(study.sft_steps):
        params, state, _ = step(params, state, jnp.asarray(sft_data(rng, 256, study)))
    return cfg, params


# ------------------------------------------------------------------ sampling and measuring
@functools.lru_cache(maxsize=None)
def _sampler(cfg, max_tokens: int):
    import jax
    import jax.numpy as jnp

    from jaxrl_llm.models import forward

    @jax.jit
    def sample(params, prompts, key):
        n = prompts.shape[0]
        tokens = jnp.zeros((n, 1 + max_tokens), jnp.int32).at[:, 0].set(prompts)

        def body(t, carry):
            tokens, done, key = carry
            key, sub = jax.random.split(key)
            logits, _ = forward(params, cfg, tokens, attention_mask=jnp.ones_like(tokens))
            tok = jax.random.categorical(sub, jax.lax.dynamic_index_in_dim(logits, t, 1, keepdims=False))
            tok = jnp.where(done, PAD, tok).astype(jnp.int32)
            tokens = jax.lax.dynamic_update_index_in_dim(tokens, tok, t + 1, 1)
            return tokens, done | (tok == EOS), key

        tokens, _, _ = jax.lax.fori_loop(0, max_tokens, body, (tokens, jnp.zeros(n, bool), key))
        return tokens

    @jax.jit
    def eos_prob(params, tokens):
        logits, _ = forward(params, cfg, tokens, attention_mask=jnp.ones_like(tokens))
        return jax.nn.softmax(logits, axis=-1)[..., EOS]

    return sample, eos_prob


def completion_arrays(tokens: np.ndarray):
    """Completion mask [N, T] (answer .. EOS inclusive), lengths, truncated flags, rewards."""
    completion = tokens[:, 1:]
    eos = completion == EOS
    has_eos = eos.any(axis=1)
    lengths = np.where(has_eos, eos.argmax(axis=1) + 1, completion.shape[1])
    mask = (np.arange(completion.shape[1])[None, :] < lengths[:, None]).astype(np.float32)
    rewards = (completion[:, 0] == RIGHT).astype(np.float32)
    return mask, lengths, ~has_eos, rewards


def eval_tokens(seed: int, study: MechanismStudy) -> np.ndarray:
    """[2, E, 1 + T]: for a right (0) and a wrong (1) answer, every prompt x `eval_fillers`
    fixed filler strings (no EOS): where the stop probability is measured."""
    rng = np.random.default_rng(20_000 + seed)
    fillers = FILLER0 + rng.integers(0, NUM_FILLERS, (study.eval_fillers, study.max_tokens - 1))
    rows = []
    for answer in (RIGHT, WRONG):
        rows.append([[PROMPT0 + p, answer, *f] for p in range(NUM_PROMPTS) for f in fillers])
    return np.asarray(rows, np.int32)


def stop_probability(eos_prob, params, tokens: np.ndarray) -> np.ndarray:
    """[2] mean EOS probability over the free positions (after the answer) of `eval_tokens`."""
    probs = np.asarray(eos_prob(params, tokens.reshape(-1, tokens.shape[-1]))).reshape(*tokens.shape)
    return probs[..., 1:-1].mean(axis=(1, 2))  # predictions of free tokens 1 .. T-1


# ------------------------------------------------------------------ one run
def run_recipe(learner, recipe, params, seed: int, study: MechanismStudy, eos_prob, sample) -> dict:
    """`study.steps` RL steps of `recipe` from `params`; per-step measurements."""
    import jax
    import jax.numpy as jnp

    from jaxrl_llm import core
    from jaxrl_llm.train.batch import SequenceBatch

    n = NUM_PROMPTS * study.samples
    prompts = jnp.asarray(np.repeat(PROMPT0 + np.arange(NUM_PROMPTS), study.samples), jnp.int32)
    evals = eval_tokens(seed, study)
    state = learner.init(params)
    key = jax.random.key(30_000 + seed)
    log = {k: [] for k in ("q_right", "q_wrong", "reward", "length_right", "length_wrong", "truncated",
                           "force_right", "force_wrong", "closed_right", "closed_wrong", "q_free")}
    for step in range(study.steps + 1):
        q = stop_probability(eos_prob, state.params, evals)
        log["q_right"].append(float(q[0]))
        log["q_wrong"].append(float(q[1]))
        if step == study.steps:
            break
        key, sub = jax.random.split(key)
        tokens = np.asarray(sample(state.params, prompts, sub))
        mask, lengths, truncated, rewards = completion_arrays(tokens)
        attention = np.concatenate([np.ones((n, 1), np.int32), mask.astype(np.int32)], axis=1)
        positions = np.maximum(np.cumsum(attention, axis=1) - 1, 0).astype(np.int32)
        seq = SequenceBatch(tokens, attention, positions, mask, np.zeros_like(mask), truncated, 1)
        old_logp, _ = learner.logprobs(state.params, seq)
        # The answer token stays out of the loss: P(RIGHT) stays at its start, so every group keeps a
        # mix of right and wrong answers and only the free part (the length) is trained.
        free_mask = mask.copy()
        free_mask[:, 0] = 0.0
        batch, _ = core.prepare_step_batch(recipe, jnp.asarray(rewards.reshape(NUM_PROMPTS, -1)),
                                           jnp.asarray(free_mask), old_logp, truncated=jnp.asarray(truncated))
        # The stop-logit force of this step: sum_it w_it A_i (1[EOS] - q_it) over free positions,
        # by class, from the real step batch; and its closed form at the step's mean q.
        q_tok = np.asarray(eos_prob(state.params, tokens))[:, 1:-1]  # predicts completion positions 1..T-1
        weights, advantages = np.asarray(batch.loss_weights), np.asarray(batch.advantages)
        free = weights[:, 1:] * advantages[:, 1:] * ((tokens[:, 2:] == EOS) - q_tok)  # 0 off the mask
        right = rewards >= 1
        log["force_right"].append(float(free[right].sum()))
        log["force_wrong"].append(float(free[~right].sum()))
        q_mean = float((q_tok * mask[:, 1:]).sum() / max(mask[:, 1:].sum(), 1))
        kept_tokens = np.asarray(batch.mask).sum(axis=1)
        kept = kept_tokens > 0
        row_advantages = (advantages * np.asarray(batch.mask)).sum(axis=1) / np.maximum(kept_tokens, 1)
        closed = length_drift.expected_stop_drift(  # the loss sees the free part only: a = 0 answer tokens
            recipe.aggregation, min(max(q_mean, 1e-4), 1 - 1e-4), row_advantages,
            right & kept, answer_tokens=0, max_tokens=study.max_tokens - 1, num_responses=int(kept.sum()) or 1,
            constant_length=recipe.constant_length)
        log["closed_right"].append(closed.right)
        log["closed_wrong"].append(closed.wrong)
        log["q_free"].append(q_mean)
        log["reward"].append(float(rewards.mean()))
        log["length_right"].append(float(lengths[right].mean()) if right.any() else float("nan"))
        log["length_wrong"].append(float(lengths[~right].mean()) if (~right).any() else float("nan"))
        log["truncated"].append(float(truncated.mean()))
        state, _ = learner.update(state, seq, batch)
    return log



def study_recipes(study: MechanismStudy) -> dict:
    """{name: core recipe} of RECIPES; Dr. GRPO's constant normaliser is the study's max_tokens."""
    from jaxrl_llm import core

    return {r: core.get_recipe(r, **({"constant_length": study.max_tokens} if r == "dr_grpo" else {}))
            for r in RECIPES}


def run_study(study: MechanismStudy, *, name: str = "length_mechanism") -> dict[str, list[dict]]:
    """Every recipe from the same supervised start, seed by seed: {recipe: [run_recipe's log per seed]}."""
    from jaxrl_llm.train.config import TrainConfig
    from jaxrl_llm.train.learner import Learner

    n = NUM_PROMPTS * study.samples
    train_cfg = TrainConfig(lr=study.lr, precision="fp32", micro_batch_size=n, grad_clip=1.0)
    recipes = study_recipes(study)
    cfg = model_config()
    learners = {r: Learner(cfg, recipe, train_cfg, total_steps=study.steps) for r, recipe in recipes.items()}
    sample, eos_prob = _sampler(cfg, study.max_tokens)
    logs: dict[str, list[dict]] = {r: [] for r in RECIPES}
    start = time.time()
    for seed in range(study.seeds):
        _, params = supervised_start(seed, study)
        for r in RECIPES:
            logs[r].append(run_recipe(learners[r], recipes[r], params, seed, study, eos_prob, sample))
        print(f"[{name}] seed {seed} done ({time.time() - start:.0f} s)", flush=True)
    return logs
