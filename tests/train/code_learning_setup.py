"""A code task on which RL measurably raises held-out pass rate within minutes on CPU, for
tests/train/test_code_task_learning.py.

The task (`TypedCodeTask`): code_from_examples' prompt format ("Write a Python function `f`
that takes <a type> and satisfies these examples: f(..) == .. Reply with ... one ```python code
block."), where the rule is one of three templates fixed by the argument's type: an integer ->
``2 * x``, a string -> ``x[::-1]``, a list of integers -> ``sum(x)``. Each question draws its
type and 6 distinct inputs (4 shown, 2 hidden); its tests are the 6 asserts, graded by the real
`code_reward` (each program in the bubblewrap sandbox), all-or-nothing. Splits by the prompt's
hash, so the held-out questions are prompts never trained on. The three templates run on each
other's inputs fail (a TypeError, or a wrong value), so a wrong pick scores 0.

The start (`supervised_start`): a decoder trained from scratch (hidden 32, 2 layers, SmolLM2's
tokenizer and chat template, `benchmarks.common.addition_start.policy_from_scratch`) by supervised
learning on 32 train prompts -> ``def f(x): return <template>`` in the fenced format, where the
target's template is the right one with probability `right_fraction` (else one of the three at
random), and half of the targets define ``g`` instead of ``f`` (`misnamed_fraction`): a code bug
shared by every question (every test then raises NameError), which RL on the train prompts can
remove on the held-out prompts too, as the minus sign of `benchmarks.common.addition_start`. A first
calibration without the misnamed half (right_fraction 0.3: the start picked the right template
on 64 of 192 held-out samples; 10 dr_grpo steps of 8 x 8 at lr 1e-3 -> 71 of 192, at lr 3e-3 ->
49, garbled programs 28 -> 80) showed that 10 steps cannot teach this tiny model the
prompt-dependent pick; the shared bug is unlearned (test_code_task_learning.py's docstring).
"""
from __future__ import annotations

import dataclasses
import random
from typing import Callable, Iterator

import numpy as np

from jaxrl_llm.data import Example, TRAIN
from jaxrl_llm.data.code_tasks import CODE_INSTRUCTION
from jaxrl_llm.data.records import short_hash, split_of
from jaxrl_llm.data.task_base import GeneratedTask
from jaxrl_llm.rewards import code_reward


def _int(rng: random.Random):
    return rng.randint(-20, 20)


def _word(rng: random.Random):
    return "".join(rng.choice("abcde") for _ in range(rng.randint(2, 5)))


def _ints(rng: random.Random):
    return [rng.randint(-9, 9) for _ in range(rng.randint(1, 4))]


# argument type -> (input generator, template body, the template as a Python function)
TEMPLATES: dict[str, tuple[Callable, str, Callable]] = {
    "an integer": (_int, "2 * x", lambda x: 2 * x),
    "a string": (_word, "x[::-1]", lambda x: x[::-1]),
    "a list of integers": (_ints, "sum(x)", lambda x: sum(x)),
}
N_SHOWN, N_HIDDEN = 4, 2


def program(body: str, name: str = "f") -> str:
    """The completion that defines `name` (the task asks for f) as `body`, in the task's fenced format."""
    return f"```python\ndef {name}(x):\n    return {body}\n```"


class TypedCodeTask(GeneratedTask):
    """Write `f` from examples, its rule one of TEMPLATES chosen by the argument's type (module docstring)."""

    name = "code_by_type"
    reward_fn = staticmethod(code_reward)
    heldout_fraction = 0.3

    def example(self, rng: random.Random) -> Example:
        takes = rng.choice(list(TEMPLATES))
        draw, body, rule = TEMPLATES[takes]
        inputs: dict[str, object] = {}
        while len(inputs) < N_SHOWN + N_HIDDEN:  # distinct inputs (a string "aa" twice is one test)
            value = draw(rng)
            inputs.setdefault(repr(value), value)
        pairs = [f"f({x!r}) == {rule(x)!r}" for x in inputs.values()]
        shown = "\n".join(pairs[:N_SHOWN])
        prompt = f"Write a Python function `f` that takes {takes} and satisfies these examples:\n{shown}\n{CODE_INSTRUCTION}"
        return Example(id=f"{self.name}/{short_hash(prompt)}", task=self.name, prompt=prompt, answer=program(body),
                       split=split_of(prompt, self.heldout_fraction),
                       metadata={"tests": [f"assert {p}" for p in pairs], "scoring": "all", "sandbox": {},
                                 "takes": takes})

    def _stream(self, seed: int) -> Iterator[Example]:
        rng = random.Random(seed)
        while True:
            yield self.example(rng)


@dataclasses.dataclass(frozen=True)
class StartSetting:
    """The supervised start; calibrated in test_code_task_learning.py's docstring."""

    hidden: int = 32
    layers: int = 2
    questions: int = 32  # train questions, one fixed set, the full batch of every step
    steps: int = 100
    lr: float = 1e-2
    right_fraction: float = 1.0  # targets with the right template; the rest uniform over the three
    misnamed_fraction: float = 0.5  # targets that define g instead of f (every test then fails)
    seed: int = 0


def supervised_start(tokenizer_dir: str, out_dir: str, setting: StartSetting = StartSetting()) -> str:
    """Train the start (module docstring) and save it as an HF directory at `out_dir`; returns it."""
    import jax
    import jax.numpy as jnp
    import optax

    from jaxrl_llm import bridge
    from jaxrl_llm.benchmarks.common.addition_start import policy_from_scratch
    from jaxrl_llm.models import forward, lm_head_logits
    from jaxrl_llm.train.policy import encode_prompts

    policy = policy_from_scratch(tokenizer_dir, f"{out_dir}_init", setting.hidden, setting.layers, setting.seed)
    cfg, eos = policy.cfg, policy.eos_token_ids[0]
    examples = TypedCodeTask().examples(TRAIN, setting.questions, seed=setting.seed + 1, unique=True)
    prompts = encode_prompts(policy, examples)
    bodies = [body for _, body, _ in TEMPLATES.values()]
    forms = [(b, name) for name in ("f", "g") for b in bodies]  # form index = name * 3 + template
    answers = [policy.tokenizer.encode(program(b, name), add_special_tokens=False).ids + [eos] for b, name in forms]
    span = max(len(a) for a in answers)
    width = max(len(p) for p in prompts) + span
    right = np.array([bodies.index(TEMPLATES[e.metadata["takes"]][1]) for e in examples])
    rows = [_rows(prompts, a, width, span, policy.pad_id) for a in answers]
    stacked = {k: np.stack([r[k] for r in rows]) for k in rows[0]}  # [form, question, ...]
    optimizer = optax.adamw(setting.lr, weight_decay=0.0)

    def loss_fn(params, batch):
        hidden, _ = forward(params, cfg, batch["tokens"], attention_mask=batch["mask"], return_hidden=True)
        hidden = jnp.take_along_axis(hidden, batch["gather"][..., None], axis=1)
        logp = jax.nn.log_softmax(lm_head_logits(hidden, params, cfg).astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1)[..., 0]
        return jnp.sum(nll * batch["loss_mask"]) / jnp.sum(batch["loss_mask"])

    @jax.jit
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params, opt_state = policy.params, optimizer.init(policy.params)
    rng = np.random.default_rng(setting.seed + 2)
    n = len(examples)
    with jax.default_matmul_precision("highest"):
        for _ in range(setting.steps):
            pick = np.where(rng.random(n) < setting.right_fraction, right, rng.integers(0, len(bodies), n))
            pick = pick + len(bodies) * (rng.random(n) < setting.misnamed_fraction)
            batch = {k: jnp.asarray(v[pick, np.arange(n)]) for k, v in stacked.items()}
            params, opt_state, _ = step(params, opt_state, batch)
    return bridge.save_hf_dir(cfg, jax.device_get(params), out_dir, tokenizer_dir=tokenizer_dir)


def _rows(prompts, answer, width: int, span: int, pad_id: int) -> dict[str, np.ndarray]:
    """Every prompt followed by `answer`, right-padded to `width`; the loss reads the `span`
    positions that predict the answer's tokens."""
    n = len(prompts)
    out = {"tokens": np.full((n, width), pad_id, np.int32), "mask": np.zeros((n, width), np.int32),
           "gather": np.zeros((n, span), np.int32), "targets": np.full((n, span), pad_id, np.int32),
           "loss_mask": np.zeros((n, span), np.float32)}
    for i, p in enumerate(prompts):
        out["tokens"][i, :len(p) + len(answer)] = p + answer
        out["mask"][i, :len(p) + len(answer)] = 1
        out["gather"][i] = len(p) - 1 + np.minimum(np.arange(span), len(answer) - 1)
        out["targets"][i, :len(answer)] = answer
        out["loss_mask"][i, :len(answer)] = 1
    return out
