"""Reward functions: ``reward(completion_text, example) -> float``.

``example`` is any object with ``answer`` (str) and ``metadata`` (a mapping),
such as :class:`jaxrl_llm.data.Example`; this package does not import the
data package, it only reads those two attributes.

Rewards are module-level functions so a worker process can unpickle them
(see :mod:`jaxrl_llm.rewards.pool`). Heavy libraries (math-verify, sympy,
reasoning-gym) are imported on first use, so importing this module is cheap.
"""
from __future__ import annotations

import functools
import json
import logging
from typing import Any, Callable, Protocol

from jaxrl_llm.rewards.extract import (
    extract_integer_answer,
    extract_last_boxed,
    extract_tagged_answer,
    normalize_math_answer,
)


class Gradable(Protocol):
    answer: str
    metadata: Any


RewardFn = Callable[[str, Gradable], float]


def trusted_in_process(reward_fn: RewardFn) -> RewardFn:
    """Mark a reward as cheap and unable to hang, so pools may run it in process.

    A grader marked this way skips the worker round trip (and therefore any
    timeout); mark only pure functions with bounded cost.
    """
    reward_fn.trusted_in_process = True
    return reward_fn


def warm_up_with(prepare: Callable[[], object]) -> Callable[[RewardFn], RewardFn]:
    """Attach ``prepare`` for a grading worker to run once after loading the reward.

    Workers run it before any per-answer deadline starts, so heavy imports
    and first-call initialisation (sympy, the LaTeX parser) never count as a
    timeout.
    """

    def attach(reward_fn: RewardFn) -> RewardFn:
        reward_fn.warm_up = prepare
        return reward_fn

    return attach


@trusted_in_process
def addition_reward(completion: str, example: Gradable) -> float:
    """1.0 if the completion's integer answer equals ``example.answer``, else 0.0.

    The answer is read by :func:`extract_integer_answer` (first line with a
    digit, after the last "=", exactly one integral number).
    """
    answered = extract_integer_answer(completion)
    return float(answered is not None and answered == int(example.answer))


@trusted_in_process
def exact_match_reward(completion: str, example: Gradable) -> float:
    """1.0 if the completion's answer text equals ``example.answer`` exactly, else 0.0.

    The answer text is the last ``<answer>...</answer>``, else the last ``\\boxed{}``, else
    the whole completion (:func:`reasoning_gym_answer_text`); both sides are compared
    with surrounding whitespace removed and inner runs of whitespace as one space.
    """
    def canonical(text: str) -> str:
        return " ".join(text.split())

    return float(canonical(reasoning_gym_answer_text(completion)) == canonical(str(example.answer)))


def _warm_up_math_verify() -> None:
    math_answers_equal("\\frac{1}{2}", "0.5")


@warm_up_with(_warm_up_math_verify)
def math_verify_reward(completion: str, example: Gradable) -> float:
    """1.0 if the last ``\\boxed{}`` of the completion equals the gold answer.

    The gold answer is ``example.answer``; if it contains a ``\\boxed{}``
    (a full MATH-style solution) its last box is the gold. A completion
    without a closed box scores 0. Equality: see :func:`math_answers_equal`.
    """
    predicted = extract_last_boxed(completion)
    if predicted is None:
        return 0.0
    return float(math_answers_equal(gold_math_answer(example.answer), predicted))


def gold_math_answer(answer: str) -> str:
    """The gold answer of a math example: its last box if it has one, else itself."""
    boxed = extract_last_boxed(answer)
    return boxed if boxed is not None else answer.strip()


def math_answers_equal(gold: str, predicted: str) -> bool:
    """Whether two short LaTeX answers are the same value.

    True if their normalised spellings match (:func:`normalize_math_answer`,
    a fast path that also covers answers math-verify cannot parse, such as
    words), or if math-verify (Hugging Face, github.com/huggingface/Math-Verify)
    parses both and finds them equivalent: ``\\frac{1}{2}`` = ``0.5``,
    ``\\sqrt{2}/2`` = ``\\frac{1}{\\sqrt{2}}``, ``\\{1,2\\}`` = ``\\{2,1\\}``.
    math-verify's own signal-based timeouts are off (they fail outside the
    main thread); bound the time with a grading pool instead.
    """
    gold_norm = normalize_math_answer(gold)
    if gold_norm and gold_norm == normalize_math_answer(predicted):
        return True
    parse, verify = _math_verify()
    gold_parsed = parse(f"${gold}$", parsing_timeout=None)
    predicted_parsed = parse(f"${predicted}$", parsing_timeout=None)
    if not gold_parsed or not predicted_parsed:
        return False
    return bool(verify(gold_parsed, predicted_parsed, timeout_seconds=None))


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once per process that its timeout is off; we time out ourselves."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


@functools.cache
def _math_verify():
    import math_verify

    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropTimeoutDisabledWarning())
    return math_verify.parse, math_verify.verify


_RG_KEYS = ("rg_dataset", "rg_config", "rg_question", "rg_metadata")


def _warm_up_reasoning_gym() -> None:
    import reasoning_gym  # noqa: F401  (registers every data set: seconds of imports)


@warm_up_with(_warm_up_reasoning_gym)
def reasoning_gym_reward(completion: str, example: Gradable) -> float:
    """Score from the reasoning-gym data set's own verifier (``score_answer``).

    The answer handed to the verifier is the content of the last
    ``<answer>...</answer>`` (reasoning-gym's convention), else of the last
    ``\\boxed{}``, else the whole stripped completion. The verifier's score is
    returned as is; some verifiers give partial credit (countdown gives 0.01
    for a well-formed wrong expression).

    ``example.metadata`` must hold ``rg_dataset`` (name), ``rg_config``
    (the dataset config kwargs), ``rg_question`` and ``rg_metadata`` (the
    generated entry's fields), as written by
    :class:`jaxrl_llm.data.tasks.ReasoningGymTask`.
    """
    metadata = example.metadata
    missing = [key for key in _RG_KEYS if key not in metadata]
    if missing:
        raise KeyError(
            f"example {getattr(example, 'id', '?')} lacks metadata {missing}; reasoning_gym_reward "
            "grades examples made by jaxrl_llm.data.ReasoningGymTask"
        )
    score_answer = _reasoning_gym_scorer(
        metadata["rg_dataset"], json.dumps(metadata["rg_config"], sort_keys=True)
    )
    entry = {
        "question": metadata["rg_question"],
        "answer": example.answer,
        "metadata": metadata["rg_metadata"],
    }
    return float(score_answer(reasoning_gym_answer_text(completion), entry))


def reasoning_gym_answer_text(completion: str) -> str:
    """The answer text of a completion for a reasoning-gym verifier (see above)."""
    for extracted in (extract_tagged_answer(completion), extract_last_boxed(completion)):
        if extracted is not None:
            return extracted
    return completion.strip()


@functools.lru_cache(maxsize=64)
def _reasoning_gym_scorer(dataset: str, config_json: str):
    """The bound ``score_answer`` of a data set built with the example's config.

    Keyed by the config's JSON so a worker builds each data set once.
    """
    import reasoning_gym

    return reasoning_gym.create_dataset(dataset, **json.loads(config_json)).score_answer


from jaxrl_llm.rewards.code_grader import code_reward  # noqa: E402  (graders defined above stay first)

# Graders a config can name in task.reward_fn instead of a "package.module:function".
BUILTIN_GRADERS: dict[str, RewardFn] = {
    "exact": exact_match_reward,
    "math_verify": math_verify_reward,
    "addition": addition_reward,
    "reasoning_gym": reasoning_gym_reward,
    "code": code_reward,
}
