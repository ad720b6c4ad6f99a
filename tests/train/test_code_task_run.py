"""A 2-step RL run on the code task from the config (JAX engine, tiny random decoder), its
completions replaced by programs: a right one, a sleeper past the sandbox's deadline and one
that exits before its tests. The run finishes, counts the timeout and the error per step,
scores the right program, and records the sandbox in run_info.json."""
import json
import re

import pytest

from jaxrl_llm.train.run import loop
from jaxrl_llm.train.run.metrics import read_metrics
from jaxrl_llm.train.sample import stage as sampling
from jaxrl_llm.train.sample.prompts import task_from_config
from tests.train.tiny_run import tiny_config

SLEEPER = "```python\nimport time\ntime.sleep(60)\n```"
EXITER = "```python\nimport os\nos._exit(0)\n```"


def right_program(prompt: str) -> str:
    """A lookup table of the prompt's examples: right on the shown tests only."""
    pairs = re.findall(r"^f\((.*)\) == (.*)$", prompt, re.MULTILINE)
    table = ", ".join(f"repr({arg}): {out}" for arg, out in pairs)
    return f"```python\ndef f(x):\n    return {{{table}}}.get(repr(x))\n```"


def test_two_steps_on_the_code_task_count_sandbox_failures(tiny_model_dir, tmp_path, monkeypatch):
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", "total_steps=2", "task.name=code_from_examples",
                      'task.kwargs={"n_hidden": 0, "sandbox": {"wall_s": 2}}', "task.reward_timeout_s=10",
                      "task.eval_every=0")
    task = task_from_config(cfg)
    n = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt

    real_grade = sampling.grade

    def grade_programs(pool, task, texts, examples, samples_per_prompt):
        """The sampled texts replaced by programs; the first one is right for its example."""
        programs = [right_program(examples[0].prompt), SLEEPER, EXITER] + ["no code"] * (n - 3)
        return real_grade(pool, task, programs, examples, samples_per_prompt)

    monkeypatch.setattr(sampling, "grade", grade_programs)
    out = loop.train(cfg, task=task)
    assert out.step == 2
    rows = read_metrics(cfg.run_path)
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["reward_timeouts"] == 1.0 and row["reward_errors"] == 1.0
        assert row["reward"] == pytest.approx(1.0 / n)  # the lookup table passes its (only, shown) tests
    info = json.loads((cfg.run_path / "run_info.json").read_text())
    assert info["sandbox"]["tool"] == "bubblewrap"
