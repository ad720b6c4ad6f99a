"""The LLM judge (task.judge) served by the real vLLM CPU server: SmolLM2-135M-Instruct, the session's
shared server (tests/rollout/conftest.py), judging addition answers.

The reward path (config -> build_task -> connect_judges -> GraderPool -> grade, as a training step
grades) is checked against a second formulation built here: the rubric filled by str.replace, rendered
with transformers' chat template of the judge model, sent as token ids in a plain HTTP request to
/v1/completions at temperature 0, the score read with this file's own regex."""
from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import requests

from jaxrl_llm.data import Example
from jaxrl_llm.rewards import GraderPool
from jaxrl_llm.train.config import load_config, replace_values
from jaxrl_llm.train.config.task import build_task
from jaxrl_llm.train.run.metrics import read_metrics
from jaxrl_llm.train.sample.grading import grade
from jaxrl_llm.train.sample.judge import connect_judges

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[2]
MAX_TOKENS = 32
# SmolLM2-135M follows this few-shot rubric often, not always: both kinds of answers occur below.
FEW_SHOT = ("Grade answers with Score: <0-10>.\n\nQuestion: What is 1 + 1?\nAnswer: 2\nScore: 10\n\n"
            "Question: What is 1 + 2?\nAnswer: 5\nScore: 0\n\nQuestion: {prompt}\nAnswer: {response}")
# ... and never this one (it answers about the sum instead): every answer is malformed.
PLAIN = ("Question:\n{prompt}\n\nAnswer:\n{response}\n\nIs the answer correct? Reply with one line: Score: <0-10>, "
         "where 10 means fully correct and 0 means wrong.")
QUESTIONS = {"What is 2 + 3? Answer with just the number.": "5", "What is 4 + 4? Answer with just the number.": "8"}
RESPONSES = ["5", "7", "The answer is 5.", "8", "44", "banana"]  # 3 per question, in order


def examples() -> list[Example]:
    return [Example(f"q{i}", "addition", q, a, "train") for i, (q, a) in enumerate(QUESTIONS.items())]


def judge_task(url: str, rubric: str, *overrides: str):
    cfg = load_config(REPO / "experiments/judge.py", [f"task.judge.server_urls=[{url}]", f"task.judge.max_tokens={MAX_TOKENS}",
                                                      *overrides])
    cfg = replace_values(cfg, {"task.judge.rubric": rubric})
    return cfg, build_task(cfg.task)


def direct_scores(url: str, hf_dir: str, rubric: str, pairs) -> tuple[list[float], list[str]]:
    """The second formulation: (score / 10 or 0 when the answer states none, the answer) per (question, response)."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    rewards, answers = [], []
    for question, response in pairs:
        text = rubric.replace("{prompt}", question).replace("{response}", response)
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
        body = {"model": "policy", "prompt": list(map(int, ids)), "max_tokens": MAX_TOKENS, "temperature": 0.0}
        answer = requests.post(url + "/v1/completions", json=body, timeout=300).json()["choices"][0]["text"]
        found = [int(n) for n in re.findall(r"Score: (\d+)\b(?!-)", answer)]
        rewards.append(found[-1] / 10 if found and found[-1] <= 10 else 0.0)
        answers.append(answer)
    return rewards, answers


def requests_served(url: str) -> float:
    """The server's count of finished requests (its Prometheus /metrics, every finish reason)."""
    text = requests.get(url + "/metrics", timeout=30).text
    return sum(float(v) for v in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)$", text, re.M))


def test_judge_through_the_reward_path_equals_a_direct_call(vllm_server, smollm2, tmp_path):
    """Alone and weighted with the addition grader (GDPO's parts): the judge's part equals the direct call's
    scores, the addition part is 1 for the right sum, and the judge's malformed count is the direct answers'."""
    url = vllm_server.get().url
    cfg, task = judge_task(url, FEW_SHOT, 'task.reward_fns=["judge", "addition"]', "task.reward_weights=[0.5, 1.0]",
                           "recipe.name=gdpo")
    exs = examples()
    with contextlib.ExitStack() as stack, GraderPool(1, timeout_s=30) as pool:
        connect_judges(cfg.task.judge, task.reward_fn, seed=0, run_path=str(tmp_path), stack=stack)
        graded = grade(pool, task, RESPONSES, exs, group_size=3)
    pairs = [(e.prompt, r) for e, group in zip(exs, np.reshape(RESPONSES, (2, 3))) for r in group]
    want, answers = direct_scores(url, smollm2.hf_dir, FEW_SHOT, pairs)
    np.testing.assert_array_equal(graded.parts["judge"].reshape(-1), np.float32(want))
    np.testing.assert_array_equal(graded.parts["addition"].reshape(-1), [1, 0, 1, 1, 0, 0])  # by hand
    np.testing.assert_allclose(graded.rewards.reshape(-1), 0.5 * np.float32(want) + [1, 0, 1, 1, 0, 0], rtol=1e-6)
    malformed = sum(not re.search(r"Score: \d+\b(?!-)", a) for a in answers)
    assert 0 < malformed < len(answers) and any(want), answers  # both kinds: the comparison has power
    assert graded.grader_metrics["judge_malformed"] == malformed and graded.errors == malformed
    assert graded.grader_metrics["judge_calls"] == len(RESPONSES)


def test_malformed_answers_score_zero_and_are_counted(vllm_server, smollm2, tmp_path):
    url = vllm_server.get().url
    cfg, task = judge_task(url, PLAIN)  # the judge alone
    exs = examples()
    with contextlib.ExitStack() as stack, GraderPool(1, timeout_s=30) as pool:
        connect_judges(cfg.task.judge, task.reward_fn, seed=0, run_path=str(tmp_path), stack=stack)
        graded = grade(pool, task, ["5", "8"], exs, group_size=1)
    _, answers = direct_scores(url, smollm2.hf_dir, PLAIN, [(e.prompt, r) for e, r in zip(exs, ["5", "8"])])
    assert not any(re.search(r"Score: \d", a) for a in answers), answers  # the small model ignores the format
    assert graded.rewards.tolist() == [[0.0], [0.0]] and graded.errors == 2
    assert graded.grader_metrics == {"judge_calls": 2, "judge_cache_hits": 0, "judge_malformed": 2,
                                     "judge_timeouts": 0, "judge_errors": 0}


def test_the_cache_sends_each_judge_prompt_once(vllm_server, tmp_path):
    """Counted by the server itself (/metrics): the first batch reaches it once per distinct prompt, the same
    batch again not at all, and gets the same rewards."""
    url = vllm_server.get().url
    cfg, task = judge_task(url, FEW_SHOT, "task.judge.cache_size=100")
    exs = examples()
    texts = ["5", "5", "7", "8", "8", "8"]  # 3 distinct (question, response) pairs
    with contextlib.ExitStack() as stack, GraderPool(1, timeout_s=30) as pool:
        connect_judges(cfg.task.judge, task.reward_fn, seed=0, run_path=str(tmp_path), stack=stack)
        before = requests_served(url)
        first = grade(pool, task, texts, exs, group_size=3)
        middle = requests_served(url)
        second = grade(pool, task, texts, exs, group_size=3)
        after = requests_served(url)
    assert (middle - before, after - middle) == (3, 0)
    np.testing.assert_array_equal(first.rewards, second.rewards)
    assert second.grader_metrics["judge_cache_hits"] == 3 and second.grader_metrics["judge_calls"] == 0


def test_a_judge_request_past_its_timeout_scores_zero_and_is_counted(vllm_server, tmp_path):
    url = vllm_server.get().url
    cfg, task = judge_task(url, FEW_SHOT, "task.judge.timeout_s=0.001", "task.judge.max_retries=0",
                           "task.judge.cache_size=0")
    with contextlib.ExitStack() as stack, GraderPool(1, timeout_s=30) as pool:
        connect_judges(cfg.task.judge, task.reward_fn, seed=0, run_path=str(tmp_path), stack=stack)
        graded = grade(pool, task, ["5", "8"], examples(), group_size=1)
    assert graded.rewards.tolist() == [[0.0], [0.0]] and (graded.timeouts, graded.errors) == (2, 0)
    assert graded.grader_metrics["judge_timeouts"] == 2


@pytest.mark.slow  # ~2 min on 2 cores: the JAX sampler and learner compile for SmolLM2
def test_jaxrl_train_runs_the_judge_example_for_one_step(vllm_server, tmp_path):
    """README's line (`jaxrl train --config experiments/judge.py`), one small step, the judge on the shared
    server: the step's judge metrics say every distinct answer was judged once."""
    env = {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "jaxrl_llm.cli", "train", "--config", str(REPO / "experiments/judge.py"),
           "total_steps=1", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=2", "rollout.max_tokens=6",
           f"task.judge.server_urls=[{vllm_server.get().url}]", f"run_dir={tmp_path / 'run'}"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (row,) = read_metrics(tmp_path / "run")
    assert 1 <= row["judge_calls"] <= 4 and row["judge_cache_hits"] == 0  # 4 answers, each distinct one sent once
    assert row["judge_timeouts"] == row["judge_errors"] == 0
    assert row["judge_malformed"] <= row["reward_errors"] <= 4 * row["judge_malformed"]  # repeats count per answer
