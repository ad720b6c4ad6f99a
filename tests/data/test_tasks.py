"""Procedural tasks: exact prompts, correct answers, deterministic draws, disjoint splits.

Expected values are recomputed here from the prompt text (regex + Python
arithmetic) and from the documented split rule with hashlib, not read back
from the generators' metadata.
"""
import hashlib
import itertools
import re

import pytest

from jaxrl_llm.data import (
    HELDOUT,
    TRAIN,
    AdditionTask,
    ReasoningGymTask,
    make_task,
    task_names,
)

ADDITION_PROMPT = re.compile(r"What is (\d+) \+ (\d+)\? Answer with just the number\.")


def heldout_by_rule(question: str, fraction: float = 0.3) -> bool:
    """The documented split rule, written out independently."""
    return int(hashlib.sha256(question.encode()).hexdigest()[:16], 16) < fraction * 2**64


def operands(prompt: str) -> tuple[int, int]:
    match = ADDITION_PROMPT.fullmatch(prompt)
    assert match, f"prompt not in the specified form: {prompt!r}"
    return int(match.group(1)), int(match.group(2))


def test_addition_prompt_text_is_exactly_as_specified():
    example = AdditionTask(digits=1).example(3, 4)
    assert example.prompt == "What is 3 + 4? Answer with just the number."
    assert example.answer == "7"
    assert example.id == "addition/3+4"


def test_one_digit_split_partitions_the_100_questions_by_question():
    task = AdditionTask(digits=1)
    train = {operands(e.prompt) for e in task.all_examples(TRAIN)}
    heldout = {operands(e.prompt) for e in task.all_examples(HELDOUT)}
    every_pair = set(itertools.product(range(10), range(10)))
    assert train | heldout == every_pair
    assert not train & heldout
    expected_heldout = {(a, b) for a, b in every_pair if heldout_by_rule(f"{a} + {b}")}
    assert heldout == expected_heldout
    assert len(heldout) == 29  # of 100, with heldout_fraction 0.3


@pytest.mark.parametrize("digits, low, high", [(1, 0, 9), (2, 10, 99), (3, 100, 999), (5, 10_000, 99_999)])
def test_addition_answers_and_operand_ranges(digits, low, high):
    task = AdditionTask(digits=digits)
    for split in (TRAIN, HELDOUT):
        for example in task.examples(split, 200, seed=7):
            a, b = operands(example.prompt)
            assert low <= a <= high and low <= b <= high
            assert int(example.answer) == a + b
            assert example.split == split
            assert heldout_by_rule(f"{a} + {b}") == (split == HELDOUT)


def test_draws_are_deterministic_and_seed_dependent():
    task = AdditionTask(digits=2)
    first = task.examples(TRAIN, 50, seed=3)
    assert first == AdditionTask(digits=2).examples(TRAIN, 50, seed=3)
    assert first != task.examples(TRAIN, 50, seed=4)


def test_train_draws_never_contain_heldout_questions():
    task = AdditionTask(digits=1)
    heldout_ids = {e.id for e in task.all_examples(HELDOUT)}
    for seed in range(5):
        drawn = {e.id for e in task.examples(TRAIN, 300, seed=seed)}
        assert not drawn & heldout_ids


def test_unique_draws_cover_a_small_split_and_refuse_more():
    task = AdditionTask(digits=1)
    drawn = task.examples(HELDOUT, 29, seed=0, unique=True)
    assert {e.id for e in drawn} == {e.id for e in task.all_examples(HELDOUT)}
    with pytest.raises(ValueError, match="found only 29 distinct heldout questions"):
        task.examples(HELDOUT, 30, seed=0, unique=True)


CHAIN_TERM = re.compile(r"([+-])?\s*(-?\d+)")


def chain_sum_value(question: str) -> int:
    """Evaluate 'State the final answer ...: 4 - 1 - 7 =' by hand-rolled parsing."""
    expression = question.split(":")[-1].rstrip(" =")
    total = 0
    for sign, number in CHAIN_TERM.findall(expression):
        total += -int(number) if sign == "-" else int(number)
    return total


def test_chain_sum_answers_recomputed_and_graded():
    task = make_task("chain_sum")
    for example in task.examples(TRAIN, 30, seed=1):
        value = chain_sum_value(example.metadata["rg_question"])
        assert int(example.answer) == value
        assert task.reward_fn(f"<answer>{value}</answer>", example) == 1.0
        assert task.reward_fn(f"<answer>{value + 1}</answer>", example) == 0.0


def test_reasoning_gym_splits_are_disjoint_and_follow_the_rule():
    task = make_task("chain_sum")
    train = task.examples(TRAIN, 300, seed=0)
    heldout = task.examples(HELDOUT, 300, seed=0)
    assert not {e.prompt for e in train} & {e.prompt for e in heldout}
    assert all(not heldout_by_rule(e.metadata["rg_question"]) for e in train)
    assert all(heldout_by_rule(e.metadata["rg_question"]) for e in heldout)


def test_reasoning_gym_adjacent_seeds_give_different_streams():
    # reasoning-gym seeds item i with seed + i; raw adjacent seeds would share
    # all but one item.
    task = make_task("basic_arithmetic")
    zero = [e.prompt for e in task.examples(TRAIN, 100, seed=0)]
    one = [e.prompt for e in task.examples(TRAIN, 100, seed=1)]
    assert zero == [e.prompt for e in make_task("basic_arithmetic").examples(TRAIN, 100, seed=0)]
    assert len(set(zero) & set(one)) < 10


def test_reasoning_gym_instruction_and_config_reach_the_prompt():
    task = ReasoningGymTask("chain_sum", instruction="\nAnswer in <answer></answer>.", min_terms=5, max_terms=5)
    for example in task.examples(TRAIN, 10, seed=0):
        assert example.prompt == example.metadata["rg_question"] + "\nAnswer in <answer></answer>."
        assert len(CHAIN_TERM.findall(example.metadata["rg_question"].split(":")[-1])) == 5


@pytest.mark.parametrize("name", [n for n in task_names()
                                  # these need arguments (gem and verifiers an env_id: tests/envs)
                                  if n not in ("jsonl", "data_file", "reasoning_gym", "gem", "verifiers")])
def test_every_registered_task_grades_its_reference_answer_as_correct(name):
    task = make_task(name)
    for example in task.examples(TRAIN, 2, seed=0):
        assert example.task == name
        assert task.reward_fn(example.answer, example) == 1.0


def test_registry_errors_name_the_valid_choices():
    with pytest.raises(ValueError, match="unknown task 'additon'; valid tasks: addition, addition_answer_first, basic_arithmetic"):
        make_task("additon")
    with pytest.raises(ValueError, match="unknown reasoning-gym data set 'mazes'; valid names: .*maze"):
        make_task("reasoning_gym", dataset="mazes")
    with pytest.raises(ValueError, match="valid fields: min_terms, max_terms"):
        make_task("chain_sum", num_terms=3)
    with pytest.raises(ValueError, match=r"\['seed'\] are set per draw"):
        make_task("chain_sum", seed=1)
    with pytest.raises(ValueError, match="digits must be an int >= 1, got 0"):
        make_task("addition", digits=0)


def test_bad_requests_are_named():
    task = AdditionTask()
    with pytest.raises(ValueError, match="unknown split 'test'; valid splits are"):
        task.examples("test", 1, seed=0)
    with pytest.raises(ValueError, match="no heldout questions: heldout_fraction=0.0"):
        AdditionTask(heldout_fraction=0.0).examples(HELDOUT, 1, seed=0)
    with pytest.raises(ValueError, match="heldout_fraction must be in"):
        AdditionTask(heldout_fraction=1.5)
    with pytest.raises(ValueError, match="all_examples enumerates at most 3-digit"):
        AdditionTask(digits=4).all_examples(TRAIN)
