"""The user's own reward, task and data named in the config (train/config/task.py): each
reaches the run through the config alone, and every bad name is a ConfigError naming its field."""
from __future__ import annotations

import json
import os
import sys

import pytest

from jaxrl_llm.data import TASK_FACTORIES, TRAIN, Example, register_task
from jaxrl_llm.rewards import GraderPool, exact_match_reward, math_verify_reward
from jaxrl_llm.train.config import Config, ConfigError, apply_overrides
from jaxrl_llm.train.sample.grading import grade
from jaxrl_llm.train.sample.prompts import task_from_config
from tests.train import user_plugins

PLUGINS = "tests.train.user_plugins"


def config(*overrides: str) -> Config:
    return apply_overrides(Config(), list(overrides))


def test_user_reward_is_called_in_a_grader_worker_process():
    cfg = config(f"task.reward_fn={PLUGINS}:worker_pid_reward")
    task = task_from_config(cfg)
    examples = task.examples(TRAIN, 2, seed=0)
    with GraderPool(1, timeout_s=30.0) as pool:
        graded = grade(pool, task, ["a", "b", "c", "d"], examples, 2)
        worker_pids = pool.worker_pids
    pids = set(graded.rewards.reshape(-1).tolist())
    assert len(pids) == 1 and pids != {float(os.getpid())}
    assert pids == {float(worker_pids[0])}
    assert (graded.errors, graded.timeouts) == (0, 0)


def test_raising_hanging_and_bad_valued_user_rewards_score_zero_and_are_counted():
    cfg = config(f"task.reward_fn={PLUGINS}:misbehaving_reward", "task.reward_timeout_s=1.0")
    task = task_from_config(cfg)
    examples = task.examples(TRAIN, 1, seed=0)
    texts = ["right", "boom", "hang", "nan", "text", "wrong"]
    with GraderPool(1, timeout_s=cfg.task.reward_timeout_s) as pool:
        graded = grade(pool, task, texts, examples, len(texts))
        after = grade(pool, task, ["right"], examples, 1)  # the pool still grades after a kill
    assert graded.rewards.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
    assert (graded.errors, graded.timeouts) == (3, 1)  # boom, nan, text; hang
    assert after.rewards.tolist() == [[1.0]]


@pytest.mark.parametrize("overrides, names", [
    (["task.reward_fn=no_such_module_xyz:score"], ["task.reward_fn", "no_such_module_xyz"]),
    ([f"task.reward_fn={PLUGINS}:no_such_function"], ["task.reward_fn", "no_such_function"]),
    ([f"task.reward_fn={PLUGINS}:NOT_CALLABLE"], ["task.reward_fn", "not a function"]),
    ([f"task.reward_fn={PLUGINS}:lambda_reward"], ["task.reward_fn", "cannot be sent to a grader worker"]),
    ([f"task.reward_fn={PLUGINS}:one_argument_reward"], ["task.reward_fn", "fn(completion, example)"]),
    (["task.reward_fn=exactt"], ["task.reward_fn", "did you mean 'exact'"]),
    (["task.plugins=no_such_plugin_xyz"], ["task.plugins", "no_such_plugin_xyz"]),
    (["task.kwargs={\"digitz\": 2}"], ["task.kwargs", "task 'addition'", "'digitz'", "accepts: digits, heldout_fraction"]),
    (["task.kwargs=[1, 2]"], ["task.kwargs", "not a JSON object"]),
    (["task.kwargs={\"digits\": 2}"], ["task.kwargs", "task.digits"]),
    (["task.name=no_such_task"], ["task.name = 'no_such_task'", "task.plugins"]),
    (["task.data_path=problems.xlsx"], ["task.data_path", ".xlsx", ".parquet"]),
    (["task.name=guess_number", "task.reward_fn=exact"], ["task.reward_fn", "environment task", "unset"]),
    (['task.env_kwargs={"size": 5}'], ["task.env_kwargs", "without task.env", "task.kwargs"]),
])
def test_bad_plugin_names_are_config_errors_naming_the_field(overrides, names):
    with pytest.raises(ConfigError) as err:
        config(*overrides)
    for name in names:
        assert name in str(err.value), str(err.value)


def test_data_files_are_opened_when_the_task_is_built(tmp_path):
    cfg = config(f"task.data_path={tmp_path / 'later.csv'}")  # may be written on another machine
    with pytest.raises(FileNotFoundError, match="later.csv"):
        task_from_config(cfg)
    with pytest.raises(ConfigError, match="task.name = 'data_file' needs task.data_path"):
        task_from_config(config("task.name=data_file"))


def test_kwargs_from_the_command_line_reach_the_task():
    cfg = config("task.name=reasoning_gym", 'task.kwargs={"dataset": "leg_counting", "min_animals": 1, "max_animals": 2}')
    assert cfg.task.kwargs == {"dataset": "leg_counting", "min_animals": 1, "max_animals": 2}
    task = task_from_config(cfg)
    assert (task.dataset, task.config) == ("leg_counting", {"min_animals": 1, "max_animals": 2})
    example = task.examples(TRAIN, 1, seed=0)[0]
    assert example.metadata["rg_dataset"] == "leg_counting" and example.metadata["rg_config"] == {"min_animals": 1, "max_animals": 2}
    assert Config.from_json(cfg.to_json()) == cfg  # a resumed run rebuilds the same task


def test_reasoning_gym_rejects_an_unknown_config_field_naming_its_valid_fields():
    cfg = config("task.name=reasoning_gym", 'task.kwargs={"dataset": "leg_counting", "max_animalz": 2}')
    with pytest.raises(ConfigError, match="task.kwargs.*valid fields: .*max_animals"):
        task_from_config(cfg)


def test_registered_user_task_is_found_through_task_plugins(monkeypatch):
    # As in a fresh process: the user's module not imported yet, its task not registered.
    monkeypatch.delitem(sys.modules, PLUGINS, raising=False)
    monkeypatch.delitem(TASK_FACTORIES, "user_countdown", raising=False)
    with pytest.raises(ConfigError, match="task.name = 'user_countdown' is invalid"):
        config("task.name=user_countdown")
    cfg = config(f"task.plugins={PLUGINS}", "task.name=user_countdown", 'task.kwargs={"start": 4, "word": "Zähle ab"}')
    task = task_from_config(cfg)
    assert (type(task).__module__, task.start, task.word) == (PLUGINS, 4, "Zähle ab")
    assert task.examples(TRAIN, 2, seed=0) == [
        Example("countdown/4", "user_countdown", "Zähle ab 4.", "4 3 2 1", TRAIN),
        Example("countdown/3", "user_countdown", "Zähle ab 3.", "3 2 1", TRAIN)]
    assert task.reward_fn is sys.modules[PLUGINS].answer_length_reward  # the task's own grader
    with pytest.raises(ConfigError, match=r"task 'user_countdown': unknown argument\(s\) 'strat'; it accepts: "
                                          r"start, word, heldout_fraction"):
        config(f"task.plugins={PLUGINS}", "task.name=user_countdown", 'task.kwargs={"strat": 4}')


def test_register_task_refuses_a_second_definition_under_a_taken_name():
    with pytest.raises(ValueError, match="'addition' is already registered to jaxrl_llm.data.tasks.AdditionTask"):
        register_task("addition")(user_plugins.CountdownTask)
    with pytest.raises(ValueError, match="task name 'a:b' is invalid"):
        register_task("a:b")


def test_a_user_class_named_like_a_builtin_cannot_replace_it():
    """Same class name, another module: refused (the name alone once let `class AdditionTask`
    in a user's script replace the built-in)."""
    impostor = type("AdditionTask", (user_plugins.CountdownTask,), {"__module__": "__main__"})
    with pytest.raises(ValueError, match="'addition' is already registered"):
        register_task("addition")(impostor)
    assert TASK_FACTORIES["addition"].__module__ == "jaxrl_llm.data.tasks"


def test_jsonl_file_with_a_choice_of_grader(tmp_path):
    path = tmp_path / "problems.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [{"prompt": "Half of 1?", "answer": "0.5"},
                                                      {"prompt": "Six times seven?", "answer": "42"}]) + "\n")
    completions = ["so \\boxed{\\frac{1}{2}}", "\\boxed{0.5}", "42", "\\boxed{42.0}", "abc"]
    half = Example("x", "t", "Half of 1?", "0.5", TRAIN)
    expected = {  # by hand: math-verify compares values in a box, exact the text, the user grader lengths
        None: [1.0, 1.0, 0.0, 0.0, 0.0],  # math_verify, the JSONL default
        "exact": [0.0, 1.0, 0.0, 0.0, 0.0],
        f"{PLUGINS}:answer_length_reward": [0.0, 0.0, 0.0, 0.0, 1.0],  # "abc" is as long as "0.5"
    }
    with GraderPool(1, timeout_s=30.0) as pool:
        for grader, want in expected.items():
            extra = [] if grader is None else [f"task.reward_fn={grader}"]
            task = task_from_config(config(f"task.jsonl_path={path}", *extra))
            assert task.reward_fn is {None: math_verify_reward, "exact": exact_match_reward}.get(
                grader, user_plugins.answer_length_reward)
            graded = grade(pool, task, completions, [half], len(completions))
            assert graded.rewards.tolist() == [want], grader


def test_kwargs_are_read_only_and_survive_pickle_and_json():
    import copy
    import pickle

    user_task = [f"task.plugins={PLUGINS}", "task.name=user_countdown"]
    cfg = config(*user_task, 'task.kwargs={"start": 4, "word": "Count"}')
    with pytest.raises(TypeError, match="read-only"):
        cfg.task.kwargs["start"] = 5
    assert pickle.loads(pickle.dumps(cfg)) == cfg == copy.deepcopy(cfg) == Config.from_json(cfg.to_json())
    assert hash(cfg) == hash(config(*user_task, 'task.kwargs={"word": "Count", "start": 4}'))  # any key order
    assert json.loads(cfg.to_json())["task"]["kwargs"] == {"start": 4, "word": "Count"}


@pytest.mark.parametrize("overrides, message", [
    (["task.name=code_from_examples", "task.reward_timeout_s=5.0"],
     "task.reward_timeout_s = 5.0 with the sandbox's wall_s = 5.0"),
    (["task.name=humaneval", 'task.kwargs={"sandbox": {"wall_s": 20}}'], "valid: task.reward_timeout_s > 21"),
    (["task.name=code_from_examples", 'task.kwargs={"sandbox": {"wall": 2}}'], "unknown sandbox limit(s) ['wall']"),
])
def test_code_task_deadlines_are_checked(overrides, message):
    with pytest.raises(ConfigError) as info:
        config(*overrides)
    assert message in str(info.value)


def test_code_task_with_the_default_deadlines_builds():
    task = task_from_config(config("task.name=code_from_examples", 'task.kwargs={"scoring": "all"}'))
    assert task.examples(TRAIN, 1, seed=0)[0].metadata["scoring"] == "all"
