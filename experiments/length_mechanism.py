"""Experiment 5: the length-bias mechanism on a length-neutral task, through the real learner.

Question (Liu et al. 2025, Dr. GRPO, arXiv 2503.20783, section 3.1): when the reward
cannot depend on length, does GRPO's 1/|o_i| normalisation by itself lengthen wrong
answers and shorten right ones, while a constant normaliser (Dr. GRPO) does not and
token-mean (DAPO) sits in between? The closed form (reports/length_drift.py,
docs/objectives.md#length-drift-on-a-length-neutral-task) says: the stop logit after a wrong
answer falls under GRPO, stays put in expectation under a constant normaliser, and
falls ~1/N as much under token-mean.

The task: a prompt token, then ONE answer token graded alone (RIGHT = 1, anything else
= 0), then free filler tokens until EOS. The policy: a tiny decoder (models/, 2 layers,
16-token vocabulary) trained from scratch by supervised learning on that format with
P(answer = RIGHT) = 1/2 and a stop probability q0 at every free position, so its stop
probability does not depend on the answer when RL starts. Each recipe then trains it
from the same weights with the real learner (train/learner.py Learner: the recipe's
core.prepare_step_batch + core.recipe_loss, AdamW); samples come from the decoder itself
at temperature 1. The answer token is left out of the loss mask, so P(RIGHT) stays near
1/2, every group keeps a mix of right and wrong answers, and only the free part (the
length) is trained: the derivation with a = 0 answer tokens in L. Measured per step: the policy's EOS probability at the free positions
after a right and after a wrong answer (teacher-forced on fixed filler strings), sampled
lengths, and the step's stop-logit force sum_it w_it A_i (1[EOS] - q_it) read off the
real step batch, next to its closed form.

    python experiments/length_mechanism.py --quick     # 5 seeds x 3 recipes x 40 steps, ~6 min on 2 busy CPU cores
    python experiments/length_mechanism.py             # 10 seeds x 3 recipes x 80 steps, ~15-30 min (not run yet)

Writes to runs/experiments/length_mechanism/<quick|full>/: summary.md / .json (drift with
95% t-intervals over seeds), per_seed.json, drift.png (stop probability over steps: mean
and band over seeds), force.png (measured vs closed-form force per seed), run_info.json.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import time
from typing import Sequence

import numpy as np

from jaxrl_llm.reports import length_drift, stats
from jaxrl_llm.reports.runs import experiment_parser, output_dir, write_summary

NAME = "length_mechanism"
RECIPES = ("grpo", "dr_grpo", "dapo")
PAD, EOS = 0, 1
NUM_PROMPTS = 4
PROMPT0 = 2  # prompt tokens 2..5
RIGHT, WRONG = 6, 7
FILLER0, NUM_FILLERS = 8, 8  # filler tokens 8..15
VOCAB = FILLER0 + NUM_FILLERS


@dataclasses.dataclass(frozen=True)
class MechanismStudy:
    seeds: int = 10
    steps: int = 80
    samples: int = 8  # per prompt; every step uses all NUM_PROMPTS prompts
    max_tokens: int = 12  # answer + up to 11 free tokens
    stop_prob: float = 0.2  # q0 of the supervised start
    right_prob: float = 0.5
    lr: float = 1e-3
    sft_steps: int = 400
    eval_fillers: int = 4  # filler strings the stop probability is measured on


QUICK = dataclasses.replace(MechanismStudy(), seeds=5, steps=40)


def model_config():
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


def window_change(curve: list[float], k: int = 5) -> float:
    """Mean of the last k steps minus mean of the first k (finite values only)."""
    values = np.asarray(curve, float)
    k = max(1, min(k, values.size // 2))
    return float(np.nanmean(values[-k:]) - np.nanmean(values[:k]))


def per_seed_row(log: dict) -> dict:
    """One seed's numbers: drift of the stop probability (last - first), mean force and closed form."""
    return {
        "q0 right": log["q_right"][0], "q0 wrong": log["q_wrong"][0],
        "dq right": log["q_right"][-1] - log["q_right"][0],
        "dq wrong": log["q_wrong"][-1] - log["q_wrong"][0],
        "d split": (log["q_wrong"][-1] - log["q_right"][-1]) - (log["q_wrong"][0] - log["q_right"][0]),
        "force right": float(np.mean(log["force_right"])), "force wrong": float(np.mean(log["force_wrong"])),
        "closed right": float(np.mean(log["closed_right"])), "closed wrong": float(np.mean(log["closed_wrong"])),
        "d length wrong": window_change(log["length_wrong"]), "d length right": window_change(log["length_right"]),
        "reward first": log["reward"][0], "reward last": log["reward"][-1],
        "truncated": float(np.mean(log["truncated"])),
    }


def summarise(recipe: str, seeds_rows: list[dict]) -> dict:
    row = {"recipe": recipe}
    for key in ("d split", "dq wrong", "dq right", "d length wrong", "d length right", "force wrong", "closed wrong", "force right", "closed right",
                "reward last", "truncated"):
        iv = stats.interval([r[key] for r in seeds_rows])
        row[key] = stats.format_interval(iv, signed=key.startswith(("d", "force", "closed")))
        row[f"{key} interval"] = iv.to_dict()
    return row


def verdict(rows: dict[str, dict]) -> list[str]:
    """Derived: the split q_wrong - q_right falls under GRPO, stays put in expectation under a
    constant normaliser (Dr. GRPO), falls ~1/N as much under token-mean (DAPO)."""
    iv = {r: stats.Interval(**rows[r]["d split interval"]) for r in rows}
    lines = []

    def side(i):
        if i.n < 2:
            return "inconclusive (1 seed)"
        return "below 0" if i.high < 0 else "above 0" if i.low > 0 else "covers 0"

    if "grpo" in iv:
        lines.append(f"GRPO: derived split < 0 (wrong answers lengthen relative to right ones); measured interval "
                     f"{side(iv['grpo'])}: {'reproduced' if side(iv['grpo']) == 'below 0' else 'not reproduced'}")
    if "dr_grpo" in iv:
        lines.append(f"Dr. GRPO: derived split 0 in expectation; measured interval {side(iv['dr_grpo'])}: "
                     f"{'consistent' if side(iv['dr_grpo']) == 'covers 0' else 'not consistent'}")
    if {"grpo", "dr_grpo", "dapo"} <= set(iv):
        g, d, a = iv["grpo"].mean, iv["dr_grpo"].mean, iv["dapo"].mean
        lines.append(f"DAPO token-mean: derived between, close to Dr. GRPO (~1/N of GRPO's push); measured mean split "
                     f"{a:+.4f} (GRPO {g:+.4f}, Dr. GRPO {d:+.4f}), interval {side(iv['dapo'])}")
    return lines


def plot(logs: dict[str, list[dict]], path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    colors = {"grpo": "tab:red", "dr_grpo": "tab:blue", "dapo": "tab:green"}
    panels = ((axes[0], "split", "split: after wrong minus after right"),
              (axes[1], "q_wrong", "after a wrong answer"), (axes[2], "q_right", "after a right answer"))
    for ax, key, label in panels:
        for recipe, seed_logs in logs.items():
            series = [np.asarray(s["q_wrong"]) - np.asarray(s["q_right"]) if key == "split" else np.asarray(s[key])
                      for s in seed_logs]
            curves = np.array([x - x[0] for x in series])
            steps = np.arange(curves.shape[1])
            mean = curves.mean(axis=0)
            ivs = [stats.interval(curves[:, t]) for t in range(curves.shape[1])]
            ax.plot(steps, mean, color=colors.get(recipe), label=f"{recipe} (n = {len(seed_logs)})")
            ax.fill_between(steps, [i.low for i in ivs], [i.high for i in ivs], color=colors.get(recipe), alpha=0.2)
        ax.axhline(0, color="k", lw=0.6)
        ax.set_title(f"stop probability change {label}", fontsize=9)
        ax.set_xlabel("RL step")
    axes[0].set_ylabel("q(step) - q(0), mean and 95% band over seeds")
    axes[0].legend(fontsize=7)
    ax = axes[3]
    for recipe, seed_logs in logs.items():
        for cls, marker in (("wrong", "v"), ("right", "^")):
            x = [np.mean(s[f"closed_{cls}"]) for s in seed_logs]
            y = [np.mean(s[f"force_{cls}"]) for s in seed_logs]
            ax.scatter(x, y, marker=marker, color=colors.get(recipe), s=18,
                       label=f"{recipe} {cls}" if recipe == "grpo" or cls == "wrong" else None)
    lim = ax.get_xlim()
    ax.plot(lim, lim, "k--", lw=0.7)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(5))
    ax.set_xlabel("closed-form force per step (seed mean)")
    ax.set_ylabel("measured force per step (seed mean)")
    ax.set_title("stop-logit force, measured vs closed form (seeds)", fontsize=9)
    ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(out, study: MechanismStudy, logs: dict[str, list[dict]], *, quick: bool, wall_s: float) -> None:
    """per_seed.json, summary.md / .json and drift.png from the per-step logs of every seed."""
    from jaxrl_llm import core

    seeds = list(range(len(logs[RECIPES[0]])))
    n = NUM_PROMPTS * study.samples
    recipes = {r: core.get_recipe(r, **({"constant_length": study.max_tokens} if r == "dr_grpo" else {}))
               for r in RECIPES}
    per_seed = {r: [per_seed_row(log) for log in logs[r]] for r in RECIPES}
    (out / "per_seed.json").write_text(json.dumps({"study": dataclasses.asdict(study), "per_seed": per_seed,
                                                   "logs": logs}, indent=1) + "\n")
    rows = {r: summarise(r, per_seed[r]) for r in RECIPES}
    q0 = float(np.mean([r["q0 wrong"] for rs in per_seed.values() for r in rs]))
    pushes = {recipes[r].aggregation: length_drift.relative_push(
        recipes[r].aggregation, q0, answer_tokens=0, max_tokens=study.max_tokens - 1, num_responses=n,
        constant_length=study.max_tokens) for r in RECIPES}
    notes = [stats.seed_note(seeds, quick=quick, full_seeds=MechanismStudy.seeds),
             f"study: {dataclasses.asdict(study)}; wall time {wall_s:.0f} s",
             "d split: change of q_wrong - q_right (stop probability after a wrong minus after a right answer), "
             "last step minus start; dq: each alone (teacher-forced on fixed "
             "fillers). force: per-step stop-logit force sum w A (1[EOS] - q) from the real step batch; closed: its "
             "closed form (reports/length_drift.py) at the step's advantages and mean q.",
             "d length: sampled response length (tokens: answer + free part), mean of the last 5 steps minus the "
             "first 5.",
             "closed-form push per unit advantage relative to the mode's mean token weight at q0 = "
             f"{q0:.3f}: " + ", ".join(f"{m} {v:+.4f}" for m, v in pushes.items()),
             *verdict(rows)]
    columns = ["recipe", "d split", "dq wrong", "dq right", "d length wrong", "d length right", "force wrong",
               "closed wrong", "force right", "closed right", "reward last", "truncated"]
    write_summary(out, list(rows.values()), columns, title=f"Length mechanism ({'quick' if quick else 'full'})",
                  notes=notes, config={"name": NAME, "quick": quick, "study": dataclasses.asdict(study)})
    plot(logs, out / "drift.png", title=f"Length-neutral task, {len(seeds)} seeds: stop probability drift by recipe")


def main(argv: Sequence[str] | None = None) -> int:
    parser = experiment_parser(__doc__, name=NAME)
    args = parser.parse_args(argv)
    study = QUICK if args.quick else MechanismStudy()
    fields = {f.name: f.type for f in dataclasses.fields(MechanismStudy)}
    for item in args.overrides:  # e.g. seeds=2 steps=3
        key, _, value = item.partition("=")
        if key not in fields:
            raise SystemExit(f"override {item!r}: valid keys are {', '.join(fields)}")
        study = dataclasses.replace(study, **{key: (float if fields[key] == "float" else int)(value)})
    out = output_dir(args, NAME)
    from jaxrl_llm import core
    from jaxrl_llm.train.config import TrainConfig
    from jaxrl_llm.train.learner import Learner

    n = NUM_PROMPTS * study.samples
    train_cfg = TrainConfig(lr=study.lr, precision="fp32", micro_batch_size=n, grad_clip=1.0)
    recipes = {r: core.get_recipe(r, **({"constant_length": study.max_tokens} if r == "dr_grpo" else {}))
               for r in RECIPES}
    cfg = model_config()
    learners = {r: Learner(cfg, recipe, train_cfg, total_steps=study.steps) for r, recipe in recipes.items()}
    sample, eos_prob = _sampler(cfg, study.max_tokens)
    seeds = list(range(study.seeds))
    logs: dict[str, list[dict]] = {r: [] for r in RECIPES}
    start = time.time()
    for seed in seeds:
        _, params = supervised_start(seed, study)
        for r in RECIPES:
            logs[r].append(run_recipe(learners[r], recipes[r], params, seed, study, eos_prob, sample))
        print(f"[length_mechanism] seed {seed} done ({time.time() - start:.0f} s)", flush=True)
    report(out, study, logs, quick=args.quick, wall_s=time.time() - start)
    print(f"wrote {out}/summary.md, drift.png, per_seed.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
