"""Procedural tasks: seeded, deterministic prompt generators with a grader each.

A task turns ``(split, n, seed)`` into ``n`` :class:`Example` records and
names the reward function that grades completions for them. Train and
held-out splits are separated by question (see :mod:`jaxrl_llm.data.records`),
so no held-out question is ever drawn for training, whatever the seed.

Tasks:
  addition          "What is a + b? Answer with just the number." (ours; the demo)
  addition_answer_first   the same questions, answer first then free text; only the
                    leading integer is graded (length-neutral; data/answer_first.py)
  basic_arithmetic, chain_sum, countdown, ...   reasoning-gym generators,
                    graded by reasoning-gym's own verifiers
  cot_gsm_symbolic, cot_chain_sum   reasoning-gym questions + "think step by step",
                    answer in \\boxed{} (data/chain_of_thought.py)
  multiple_of       "Name a multiple of k between 1 and M": many correct answers per
                    question (for DARLING; data/many_answers.py)
  reasoning_gym     any reasoning-gym data set: make_task("reasoning_gym", dataset="maze")
  jsonl             a user file of prompt/answer lines: make_task("jsonl", path=...) (data/files.py)
  data_file         a JSON/JSONL/Parquet/CSV file read with HF datasets (data/files.py)
  calculator_tool, guess_number   multi-turn environments (data/builtin_envs.py)
  gem               any GEM environment that builds offline: make_task("gem", env_id="game:Mastermind-v0-easy")
                    (data/gem_envs.py; the optional gem extra)
  verifiers         any verifiers environment (0.3 classic API): make_task("verifiers", env_id="my_mod:load_env")
                    (data/verifiers_envs.py; the optional verifiers extra)

Every task is registered with :func:`jaxrl_llm.data.register_task` (data/registry.py),
the decorator a user's own tasks use too.
"""
from __future__ import annotations

import hashlib
import itertools
import random
from typing import Any, Callable, Iterator

from jaxrl_llm.data.answer_first import answer_first_example, leading_integer_reward
from jaxrl_llm.data.builtin_envs import CalculatorTask, GuessNumberTask
from jaxrl_llm.data.chain_of_thought import COT_INSTRUCTION, COT_TASKS
from jaxrl_llm.data.files import JsonlTask  # noqa: F401  (registers "jsonl" and "data_file")
from jaxrl_llm.data.gem_envs import GemTask
from jaxrl_llm.data.verifiers_envs import VerifiersTask
from jaxrl_llm.data.many_answers import multiple_of_stream, multiple_reward
from jaxrl_llm.data.records import (
    Example,
    check_heldout_fraction,
    check_split,
    short_hash,
    split_of,
)
from jaxrl_llm.data.registry import TASK_FACTORIES, make_task, register_task, task_names  # noqa: F401
from jaxrl_llm.data.task_base import DEFAULT_HELDOUT_FRACTION, GeneratedTask, Task  # also importable from here
from jaxrl_llm.rewards import addition_reward, reasoning_gym_reward


@register_task("addition")
class AdditionTask(GeneratedTask):
    """``What is a + b? Answer with just the number.`` with two ``digits``-digit operands.

    Operands are uniform over the ``digits``-digit integers: 0..9 for 1 digit
    (so 100 ordered pairs, the demo task), 10..99 for 2, and so on. The
    held-out split is a fixed set of questions: with the default 0.3, 29 of
    the 100 one-digit pairs. Graded by :func:`jaxrl_llm.rewards.addition_reward`.
    """

    name = "addition"
    reward_fn = staticmethod(addition_reward)
    max_enumerable_digits = 3  # 810,000 pairs; 4 digits would be 81 million

    def __init__(self, digits: int = 1, *, heldout_fraction: float = DEFAULT_HELDOUT_FRACTION):
        if not isinstance(digits, int) or isinstance(digits, bool) or digits < 1:
            raise ValueError(f"digits must be an int >= 1, got {digits!r}")
        self.digits = digits
        self.heldout_fraction = check_heldout_fraction(heldout_fraction)
        self.low = 0 if digits == 1 else 10 ** (digits - 1)
        self.high = 10**digits - 1

    def example(self, a: int, b: int) -> Example:
        """The example asking a + b (its split follows from the question)."""
        question = f"{a} + {b}"
        return Example(
            id=f"addition/{a}+{b}",
            task=self.name,
            prompt=f"What is {question}? Answer with just the number.",
            answer=str(a + b),
            split=split_of(question, self.heldout_fraction),
            metadata={"a": a, "b": b, "digits": self.digits},
        )

    def all_examples(self, split: str) -> list[Example]:
        """Every question of ``split``, ordered by (a, b)."""
        check_split(split)
        if self.digits > self.max_enumerable_digits:
            raise ValueError(
                f"all_examples enumerates at most {self.max_enumerable_digits}-digit addition, "
                f"got digits={self.digits}; use examples(split, n, seed=...) instead"
            )
        operands = range(self.low, self.high + 1)
        pairs = (self.example(a, b) for a, b in itertools.product(operands, operands))
        return [example for example in pairs if example.split == split]

    def _stream(self, seed: int) -> Iterator[Example]:
        rng = random.Random(seed)
        while True:
            a = rng.randint(self.low, self.high)
            b = rng.randint(self.low, self.high)
            yield self.example(a, b)


@register_task("addition_answer_first")
class AnswerFirstAdditionTask(AdditionTask):
    """``What is a + b? Start your reply with the number, then explain how you got it.``:
    the questions and split of :class:`AdditionTask`, graded on the leading integer alone,
    so the text after it is free (a length-neutral reward; data/answer_first.py)."""

    name = "addition_answer_first"
    reward_fn = staticmethod(leading_integer_reward)

    def example(self, a: int, b: int) -> Example:
        return answer_first_example(super().example(a, b), self.name)


@register_task("multiple_of")
class MultipleOfTask(GeneratedTask):
    """``Name a multiple of k between 1 and M.``: many correct answers per question
    (data/many_answers.py), graded by :func:`multiple_reward`."""

    name = "multiple_of"
    reward_fn = staticmethod(multiple_reward)

    def __init__(self, *, heldout_fraction: float = DEFAULT_HELDOUT_FRACTION):
        self.heldout_fraction = check_heldout_fraction(heldout_fraction)

    def _stream(self, seed: int) -> Iterator[Example]:
        return multiple_of_stream(self.name, seed, self.heldout_fraction)


class ReasoningGymTask(GeneratedTask):
    """A reasoning-gym procedural data set, graded by its own ``score_answer``.

    The prompt is reasoning-gym's question verbatim, plus ``instruction`` if
    given (e.g. "\\n\\nGive your final answer in <answer></answer> tags.").
    ``config`` goes to the data set's config class (difficulty ranges etc.).

    Seeds: reasoning-gym builds item ``i`` from ``Random(seed + i)``, so the
    streams of seeds s and s+1 would share all but one item. Our stream is
    therefore a chain of chunks of ``CHUNK`` items, chunk k built with the
    32-bit reasoning-gym seed sha256("<dataset>/<seed>/<k>"). Chunks also
    bound the work of data sets that precompute per item at construction
    (gsm_symbolic draws ``size`` templates up front).
    """

    CHUNK = 256

    reward_fn = staticmethod(reasoning_gym_reward)

    def __init__(
        self,
        dataset: str,
        *,
        heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
        instruction: str = "",
        name: str | None = None,
        **config: Any,
    ):
        import reasoning_gym.factory

        valid = sorted(reasoning_gym.factory.DATASETS)
        if dataset not in valid:
            raise ValueError(f"unknown reasoning-gym data set {dataset!r}; valid names: {', '.join(valid)}")
        reserved = {"seed", "size"} & set(config)
        if reserved:
            raise ValueError(
                f"{sorted(reserved)} are set per draw by Task.examples(seed=...); "
                f"remove them from the {dataset!r} config"
            )
        self.dataset = dataset
        self.name = name or dataset  # the task's registered name (e.g. a chain-of-thought variant)
        self.heldout_fraction = check_heldout_fraction(heldout_fraction)
        self.instruction = instruction
        self.config = dict(config)
        self._create(seed=0)  # fail now, not mid-run, on a bad config

    def _create(self, seed: int):
        import dataclasses

        import reasoning_gym

        try:
            return reasoning_gym.create_dataset(self.dataset, seed=seed, size=self.CHUNK, **self.config)
        except TypeError as exc:
            _, config_cls = reasoning_gym.factory.DATASETS[self.dataset]
            fields = [f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")]
            raise ValueError(
                f"bad config {self.config} for reasoning-gym {self.dataset!r} ({exc}); "
                f"valid fields: {', '.join(fields)}"
            ) from exc

    def example_from_entry(self, entry: dict[str, Any]) -> Example:
        question = entry["question"]
        return Example(
            id=f"{self.name}/{short_hash(question)}",
            task=self.name,
            prompt=question + self.instruction,
            answer=str(entry["answer"]),
            split=split_of(question, self.heldout_fraction),
            metadata={
                "rg_dataset": self.dataset,
                "rg_config": dict(self.config),
                "rg_question": question,
                "rg_metadata": entry["metadata"],
            },
        )

    def _stream(self, seed: int) -> Iterator[Example]:
        for chunk in itertools.count():
            key = f"{self.dataset}/{seed}/{chunk}".encode()
            dataset = self._create(seed=int(hashlib.sha256(key).hexdigest()[:8], 16))
            for index in range(self.CHUNK):
                yield self.example_from_entry(dataset[index])


# reasoning-gym data sets with short, checkable answers that suit small models.
REASONING_GYM_TASKS = (
    "basic_arithmetic",
    "chain_sum",
    "countdown",
    "decimal_arithmetic",
    "fraction_simplification",
    "gcd",
    "gsm_symbolic",
    "lcm",
    "leg_counting",
    "products",
    "simple_equations",
)


def _reasoning_gym_factory(dataset: str) -> Callable[..., Task]:
    def factory(**config: Any) -> Task:
        return ReasoningGymTask(dataset, **config)

    factory.__doc__ = f"reasoning-gym {dataset!r}; kwargs as ReasoningGymTask."
    return factory


def _cot_factory(name: str) -> Callable[..., Task]:
    dataset, preset = COT_TASKS[name]

    def factory(**config: Any) -> Task:
        return ReasoningGymTask(dataset, instruction=COT_INSTRUCTION, name=name, **{**preset, **config})

    factory.__doc__ = f"reasoning-gym {dataset!r} with the chain-of-thought instruction (data/chain_of_thought.py)."
    return factory


for _name in COT_TASKS:
    register_task(_name)(_cot_factory(_name))
for _name in REASONING_GYM_TASKS:
    register_task(_name)(_reasoning_gym_factory(_name))
register_task("reasoning_gym")(ReasoningGymTask)
register_task("calculator_tool")(CalculatorTask)
register_task("guess_number")(GuessNumberTask)
register_task("gem")(GemTask)
register_task("verifiers")(VerifiersTask)
