"""A 2-step RL run on the code task from the config (JAX engine, tiny random decoder), some of
its sampled completions replaced by programs on their way to the real grading path (the pool,
code_reward): a right one, a sleeper past the sandbox's deadline, one that exits before its
tests, and in each group of 4 a planted forger (issue 61): an always-equal object in the first,
PASS lines written on the sandbox's pipes in the second. The run finishes, counts the timeout,
the error and the two suspected forgeries per step in metrics.jsonl, scores the right program 1
and the forgers 0, and records the sandbox in run_info.json."""
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
ALWAYS_EQUAL = ("```python\nclass Always:\n    def __eq__(self, other):\n        return True\n"
                "def f(x):\n    return Always()\n```")
REPORT_PIPE = ("```python\nimport os\nfor fd in map(int, os.listdir('/proc/self/fd')):\n    try:\n"
               "        if fd > 2 and os.readlink(f'/proc/self/fd/{fd}').startswith('pipe:'):\n"
               "            os.write(fd, b''.join(b'PASS %d\\n' % i for i in range(100)))\n"
               "    except OSError:\n        pass\ndef f(x):\n    return None\n```")


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
    graded_steps = []

    def grade_programs(pool, task, texts, examples, samples_per_prompt):
        """The first 5 sampled texts replaced by programs (the first one right for its example),
        a forger last in group 0 and first in group 1; the rest are the sampled texts."""
        assert samples_per_prompt == 4 and len(texts) == n == 8
        programs = [right_program(examples[0].prompt), SLEEPER, EXITER, ALWAYS_EQUAL, REPORT_PIPE, *texts[5:]]
        graded_steps.append(real_grade(pool, task, programs, examples, samples_per_prompt))
        return graded_steps[-1]

    monkeypatch.setattr(sampling, "grade", grade_programs)
    out = loop.train(cfg, task=task)
    assert out.step == 2
    rows = read_metrics(cfg.run_path)
    assert [row["step"] for row in rows] == [1, 2]
    for row, graded in zip(rows, graded_steps, strict=True):
        assert row["reward_timeouts"] == 1.0 and row["reward_errors"] == 1.0
        assert row["reward_forgery_suspected"] == 2.0  # the always-equal result, the bytes on the pipe
        assert graded.rewards[0].tolist() == [1.0, 0.0, 0.0, 0.0] and graded.rewards[1, 0] == 0.0
        # the lookup table passes its (only, shown) tests; the sampled texts (6 tokens) hold no code block
        assert row["reward"] == pytest.approx(1.0 / n)
    info = json.loads((cfg.run_path / "run_info.json").read_text())
    assert info["sandbox"]["tool"] == "bubblewrap"
