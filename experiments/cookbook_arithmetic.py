"""The Tinker cookbook's arithmetic environment (tinker-cookbook 0.6.1, recipes/math_rl/arithmetic_env.py) as a
jaxrl task, ``cookbook_arithmetic``: the same questions per step, the same prompt tokens, the same reward, so
`jaxrl train` runs the recipe experiments/tinker_learning.py runs through `jaxrl serve-tinker`. Its own module so
that the task registers under one name in the experiment, its grading worker and `jaxrl train --config`.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import numpy as np

from jaxrl_llm.data import Example, GeneratedTask, register_task

GROUPS, MAX_TOKENS = 4, 5  # math_rl's groups_per_batch and max_tokens as experiments/tinker_learning.py sets them
RENDERER = "qwen3_instruct"
COOKBOOK_BATCHES = 100  # math_rl's ArithmeticDatasetBuilder(n_batches=100): training pairs come from these
HELDOUT_DRAW = 14_001
FORMAT_COEF = 0.1  # ArithmeticEnv's format_coef


@functools.lru_cache(maxsize=4)
def renderer(model_dir: str):
    from tinker_cookbook import renderers
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    return renderers.get_renderer(RENDERER, tokenizer=get_tokenizer(model_dir))


def cookbook_batch(index: int, size: int = GROUPS) -> list[tuple[int, int]]:
    """The (x, y) of math_rl's ArithmeticDataset.get_batch(index): RandomState(index), randint(0, 101) twice."""
    rng = np.random.RandomState(index)
    return [(int(rng.randint(0, 101)), int(rng.randint(0, 101))) for _ in range(size)]


def prompt_ids(model_dir: str, x: int, y: int) -> list[int]:
    """The cookbook's prompt: its few-shot turn, then "What is x + y?", rendered by RENDERER."""
    from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticEnv

    convo = ArithmeticEnv.standard_fewshot_prefix() + [{"role": "user", "content": f"What is {x} + {y}?"}]
    return renderer(model_dir).build_generation_prompt(convo).to_ints()


def heldout_problems(n: int, groups: int = GROUPS) -> list[tuple[int, int]]:
    """n distinct sums drawn as the cookbook draws them, none in its COOKBOOK_BATCHES training batches."""
    seen = {pair for index in range(COOKBOOK_BATCHES) for pair in cookbook_batch(index, groups)}
    rng, problems = np.random.RandomState(HELDOUT_DRAW), []
    while len(problems) < n:
        pair = (int(rng.randint(0, 101)), int(rng.randint(0, 101)))
        if pair not in seen:
            seen.add(pair)
            problems.append(pair)
    return problems


def _final_integer(text: str) -> int | None:
    from tinker_cookbook.recipes.math_rl.arithmetic_env import _extract_final_int

    return _extract_final_int(text)


@register_task("cookbook_arithmetic")
class CookbookArithmetic(GeneratedTask):
    """math_rl's arithmetic environment as a task: step t's prompts are the cookbook's batch t - 1 (jaxrl train
    draws step t with seed run_seed * 1_000_003 + t, train/sample/prompts.step_seed), each prompt the text of
    the cookbook's rendered prompt (for a model directory whose chat template passes it through)."""

    name = "cookbook_arithmetic"
    heldout_fraction = 0.0

    def __init__(self, model_dir: str = "", max_tokens: int = MAX_TOKENS):
        from tokenizers import Tokenizer

        from jaxrl_llm.train.policy import resolve_model_dir

        self.model_dir = resolve_model_dir(model_dir or "smollm2")
        self.max_tokens = max_tokens
        self.tokenizer = Tokenizer.from_file(os.path.join(self.model_dir, "tokenizer.json"))

    def examples(self, split: str, n: int, *, seed: int, unique: bool = False) -> list[Example]:
        self._check_request(split, n)
        index = seed % 1_000_003 - 1  # the step; the cookbook's batches count from 0
        return [self._example(x, y) for x, y in cookbook_batch(index, n)]

    def _stream(self, seed: int):
        raise NotImplementedError("examples() draws the cookbook's batches directly")

    def _example(self, x: int, y: int) -> Example:
        text = self.tokenizer.decode(prompt_ids(self.model_dir, x, y), skip_special_tokens=False)
        return Example(id=f"cookbook_arithmetic/{x}+{y}", task=self.name, prompt=text, answer=str(x + y),
                       split="train", metadata={"x": x, "y": y})

    def reward_fn(self, completion: str, example: Example) -> float:
        """ArithmeticEnv's reward: correct + 0.1 (stopped - 1); stopped = fewer than max_tokens tokens (EOS removed)."""
        stopped = len(self.tokenizer.encode(completion, add_special_tokens=False).ids) < self.max_tokens
        return float(_final_integer(completion) == int(example.answer)) + FORMAT_COEF * (float(stopped) - 1.0)


def pass_through_model(model_dir: str, out: Path) -> str:
    """`model_dir`'s files (linked) with a chat template that renders a user turn as its text, unchanged."""
    out.mkdir(parents=True, exist_ok=True)
    for name in os.listdir(model_dir):
        if name not in ("tokenizer_config.json", "chat_template.jinja") and not (out / name).exists():
            os.symlink(os.path.join(model_dir, name), out / name)
    config = json.loads(Path(model_dir, "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ messages[-1]['content'] }}"
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return str(out)
