"""The length-bias mechanism study's machinery (experiments/length_mechanism.py drives it):
a length-neutral task, a tiny decoder trained on it from scratch, its sampler and an RL loop
through the real learner that measures the stop probability and the stop-logit force of
every step, next to their closed form (reports/length_drift.py).

The task: a prompt token, then ONE answer token graded alone (RIGHT = 1, anything else
= 0), then free filler tokens until EOS. The policy: `models.config.tiny_decoder_config`
with a 17-token vocabulary, trained by supervised learning on that format with
P(answer = RIGHT) = `right_prob` and a stop probability `stop_prob` at every free position
(`supervised_start`). `run_recipe` trains it with the recipe's Learner (train/learn/learner.py)
on samples of the decoder itself at temperature 1. The answer is drawn by the task, not by
the policy (RIGHT with probability `right_prob`, the same draws for every arm of a seed), and
left out of the loss mask: the groups stay mixed and only the free part (the length) is
trained. (Sampling the answer from the policy with it masked out of the loss, as the 12-token
runs did, let P(RIGHT) drift through the shared weights: at 48 tokens x 300 steps it reached 0
in every arm of seed 100 by step 100-200, and groups of one class have A = 0 and stop learning.)

The shared-stop arms (`Arm.shared_stop`, issue 36): the same recipe, but the policy never
sees which answer it gave. The answer is drawn and graded as usual, but the token written at
position 1, the one every later position conditions on, is a fixed SLOT token
(`policy_view`), in sampling, in the learner's batch and in the measurement alike. The stop
decision then cannot depend on the answer, and the derivation predicts no split in any mode
(the free lengths are independent of the advantages) and no drift of the shared stop logit
in expectation (the group-centred advantages sum to 0). The supervised start sees SLOT in
place of the answer in a third of its rows (their answer prediction left out of the loss),
so every arm starts from the same weights, with stop probability q0 after SLOT too.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import NamedTuple

import numpy as np

from jaxrl_llm.reports import length_drift

PAD, EOS = 0, 1
NUM_PROMPTS = 4
PROMPT0 = 2  # prompt tokens 2..5
RIGHT, WRONG = 6, 7
FILLER0, NUM_FILLERS = 8, 8  # filler tokens 8..15
SLOT = FILLER0 + NUM_FILLERS  # 16: what a shared-stop policy sees in place of its answer
VOCAB = SLOT + 1
SLOT_SHARE = 1 / 3  # rows of the supervised start that show SLOT in place of the answer


class Arm(NamedTuple):
    """One arm of the study: a recipe (core.get_recipe name) and whether the policy sees its answer."""

    recipe: str
    shared_stop: bool = False


ARMS = {"grpo": Arm("grpo"), "dr_grpo": Arm("dr_grpo"), "dapo": Arm("dapo"),
        "grpo_shared": Arm("grpo", True), "dapo_shared": Arm("dapo", True)}


@dataclasses.dataclass(frozen=True)
class MechanismStudy:
    """The study's size and its supervised start (the defaults: the full size)."""

    seeds: int = 10
    steps: int = 300
    samples: int = 8  # per prompt; every step uses all NUM_PROMPTS prompts
    max_tokens: int = 48  # answer + up to 47 free tokens
    stop_prob: float = 0.2  # q0 of the supervised start
    right_prob: float = 0.5
    lr: float = 1e-3
    sft_steps: int = 200  # q0 = 0.2036 after it (seed 0, 48 tokens)
    eval_fillers: int = 4  # filler strings the stop probability is measured on
    arms: str = "grpo,dr_grpo,dapo,grpo_shared"  # names in ARMS, comma-separated

    def __post_init__(self):
        unknown = [a for a in self.arm_names() if a not in ARMS]
        if unknown or "dr_grpo" not in self.arm_names():
            raise ValueError(f"arms={self.arms!r} is invalid; valid: names from {tuple(ARMS)}, comma-separated, "
                             "including dr_grpo (the constant normaliser every arm is paired with)")

    def arm_names(self) -> tuple[str, ...]:
        return tuple(a.strip() for a in self.arms.split(",") if a.strip())


def model_config():
    """The tiny decoder of the tests (`tiny_decoder_config`) with this task's 17-token vocabulary."""
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
    tokens[rng.random(n) < SLOT_SHARE, 1] = SLOT  # the shared-stop view (its answer target is not trained)
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
            # The completion up to and including EOS (padding only after it); SLOT is an input, never a target.
            mask = (target != PAD) & (target != SLOT)
            return jnp.sum(nll * mask) / jnp.sum(mask)

        value, grads = jax.value_and_grad(loss)(params)
        updates, state = opt.update(grads, state)
        return optax.apply_updates(params, updates), state, value

    state = opt.init(params)
    for _ in range(study.sft_steps):
        params, state, _ = step(params, state, jnp.asarray(sft_data(rng, 256, study)))
    return cfg, params


# ------------------------------------------------------------------ sampling and measuring
def policy_view(tokens, shared_stop: bool):
    """The sequences as the policy conditions on them: with `shared_stop` the answer at position 1
    replaced by SLOT; numpy or jax arrays [..., 1 + T]."""
    if not shared_stop:
        return tokens
    if isinstance(tokens, np.ndarray):
        xp = np
    else:
        import jax.numpy as xp
    hidden = xp.full_like(tokens[..., 1:2], SLOT)
    return xp.concatenate([tokens[..., :1], hidden, tokens[..., 2:]], axis=-1)


@functools.lru_cache(maxsize=None)
def _sampler(cfg, max_tokens: int, shared_stop: bool = False):
    """(sample, eos_prob): `sample(params, prompts, answers, key)` -> [n, 1 + T] the policy_view of
    prompt, the given answer and the free tokens the decoder samples after it."""
    import jax
    import jax.numpy as jnp

    from jaxrl_llm.models import forward

    @jax.jit
    def sample(params, prompts, answers, key):
        n = prompts.shape[0]
        tokens = jnp.zeros((n, 1 + max_tokens), jnp.int32).at[:, 0].set(prompts).at[:, 1].set(answers)
        tokens = policy_view(tokens, shared_stop)

        def body(t, carry):
            tokens, done, key = carry
            key, sub = jax.random.split(key)
            logits, _ = forward(params, cfg, tokens, attention_mask=jnp.ones_like(tokens))
            tok = jax.random.categorical(sub, jax.lax.dynamic_index_in_dim(logits, t, 1, keepdims=False))
            tok = jnp.where(done, PAD, tok).astype(jnp.int32)
            tokens = jax.lax.dynamic_update_index_in_dim(tokens, tok, t + 1, 1)
            return tokens, done | (tok == EOS), key

        tokens, _, _ = jax.lax.fori_loop(1, max_tokens, body, (tokens, jnp.zeros(n, bool), key))
        return tokens

    @jax.jit
    def eos_prob(params, tokens):
        logits, _ = forward(params, cfg, tokens, attention_mask=jnp.ones_like(tokens))
        return jax.nn.softmax(logits, axis=-1)[..., EOS]

    return sample, eos_prob


def completion_arrays(tokens: np.ndarray, answers: np.ndarray):
    """Completion mask [N, T] (answer .. EOS inclusive), lengths, truncated flags, rewards
    (RIGHT = 1, graded on the drawn `answers`, whatever the policy's view shows)."""
    completion = tokens[:, 1:]
    eos = completion == EOS
    has_eos = eos.any(axis=1)
    lengths = np.where(has_eos, eos.argmax(axis=1) + 1, completion.shape[1])
    mask = (np.arange(completion.shape[1])[None, :] < lengths[:, None]).astype(np.float32)
    rewards = (np.asarray(answers) == RIGHT).astype(np.float32)
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
def run_recipe(learner, recipe, params, seed: int, study: MechanismStudy, eos_prob, sample, *,
               shared_stop: bool = False) -> dict:
    """`study.steps` RL steps of `recipe` from `params`; per-step measurements. `sample` must be
    `_sampler(cfg, max_tokens, shared_stop)`'s: with `shared_stop` the policy sees SLOT, not its answer."""
    import jax
    import jax.numpy as jnp

    from jaxrl_llm import core
    from jaxrl_llm.train.learn.batch import SequenceBatch

    n = NUM_PROMPTS * study.samples
    prompts = jnp.asarray(np.repeat(PROMPT0 + np.arange(NUM_PROMPTS), study.samples), jnp.int32)
    evals = policy_view(eval_tokens(seed, study), shared_stop)
    state = learner.init(params)
    key = jax.random.key(30_000 + seed)
    draws = np.random.default_rng(40_000 + seed)  # the task's answers: the same for every arm of a seed
    log = {k: [] for k in ("q_right", "q_wrong", "q_own_right", "q_own_wrong", "reward", "length_right",
                           "length_wrong", "truncated", "force_right", "force_wrong", "closed_right", "closed_wrong",
                           "q_free")}
    for step in range(study.steps + 1):
        q = stop_probability(eos_prob, state.params, evals)
        log["q_right"].append(float(q[0]))
        log["q_wrong"].append(float(q[1]))
        if step == study.steps:
            break
        key, sub = jax.random.split(key)
        answers = np.where(draws.random(n) < study.right_prob, RIGHT, WRONG).astype(np.int32)
        tokens = np.asarray(sample(state.params, prompts, jnp.asarray(answers), sub))
        mask, lengths, truncated, rewards = completion_arrays(tokens, answers)
        attention = np.concatenate([np.ones((n, 1), np.int32), mask.astype(np.int32)], axis=1)
        positions = np.maximum(np.cumsum(attention, axis=1) - 1, 0).astype(np.int32)
        seq = SequenceBatch(tokens, attention, positions, mask, np.zeros_like(mask), truncated, 1)
        old_logp, _ = learner.logprobs(state.params, seq)
        # The answer (drawn by the task) stays out of the loss: only the free part (the length) is trained.
        free_mask = mask.copy()
        free_mask[:, 0] = 0.0
        batch, _ = core.prepare_step_batch(recipe, core.StepInputs(jnp.asarray(rewards.reshape(NUM_PROMPTS, -1)),
                                                                   jnp.asarray(free_mask), old_logp,
                                                                   truncated=jnp.asarray(truncated)))
        # The stop-logit force of this step: sum_it w_it A_i (1[EOS] - q_it) over free positions,
        # by class, from the real step batch; and its closed form at the step's mean q.
        q_tok = np.asarray(eos_prob(state.params, tokens))[:, 1:-1]  # predicts completion positions 1..T-1
        weights, advantages = np.asarray(batch.loss_weights), np.asarray(batch.advantages)
        free = weights[:, 1:] * advantages[:, 1:] * ((tokens[:, 2:] == EOS) - q_tok)  # 0 off the mask
        right = rewards >= 1
        for cls, rows in (("right", right), ("wrong", ~right)):  # on-policy: at the decision points visited
            visited = mask[rows, 1:]
            log[f"q_own_{cls}"].append(float((q_tok[rows] * visited).sum() / visited.sum()) if visited.sum()
                                       else float("nan"))
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
    """{arm: core recipe} of the study's arms; Dr. GRPO's constant normaliser is the study's max_tokens."""
    from jaxrl_llm import core

    recipes = {r: core.get_recipe(r, **({"constant_length": study.max_tokens} if r == "dr_grpo" else {}))
               for r in {ARMS[a].recipe for a in study.arm_names()}}
    return {a: recipes[ARMS[a].recipe] for a in study.arm_names()}


def run_study(study: MechanismStudy, *, name: str = "length_mechanism", seeds=None,
              on_seed=None) -> dict[str, list[dict]]:
    """Every arm from the same supervised start, seed by seed (`seeds`, default 0 .. study.seeds - 1):
    {arm: [run_recipe's log per seed]}; `on_seed(seed, {arm: log})` is called as each seed finishes."""
    from jaxrl_llm.train.config import TrainConfig
    from jaxrl_llm.train.learn.learner import Learner

    n = NUM_PROMPTS * study.samples
    # pack=False: one sequence per row, one compiled shape (packing recompiles as the lengths drift)
    train_cfg = TrainConfig(lr=study.lr, precision="fp32", micro_batch_size=n, grad_clip=1.0, pack=False)
    recipes = study_recipes(study)
    cfg = model_config()
    learners = {r: Learner(cfg, recipe, train_cfg, total_steps=study.steps)
                for r, recipe in {ARMS[a].recipe: recipes[a] for a in recipes}.items()}
    logs: dict[str, list[dict]] = {a: [] for a in recipes}
    start = time.time()
    for seed in (range(study.seeds) if seeds is None else seeds):
        _, params = supervised_start(seed, study)
        for a, arm in ((a, ARMS[a]) for a in recipes):
            sample, eos_prob = _sampler(cfg, study.max_tokens, arm.shared_stop)
            logs[a].append(run_recipe(learners[arm.recipe], recipes[a], params, seed, study, eos_prob, sample,
                                      shared_stop=arm.shared_stop))
        if on_seed is not None:
            on_seed(seed, {a: logs[a][-1] for a in recipes})
        print(f"[{name}] seed {seed} done ({time.time() - start:.0f} s)", flush=True)
    return logs
