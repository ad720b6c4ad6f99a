"""Two RL steps on the code task (`code_from_examples`) through the real vLLM CPU server:
SmolLM2-135M writes the programs, the loop grades them in the bubblewrap sandbox, learns and
pushes its weights (tests/rollout/code_task_vllm_run.py, its own process, one CPU device).

Checked independently of the loop: every completion it graded (SmolLM2's own, plus three
planted in the first group of each step) is graded again here by `code_reward` called
directly in this process (no grader pool, no loop), and the per-sample rewards of groups.jsonl,
the step's mean reward and its timeout / error counts must equal that second grading; the
planted programs' verdicts are known by hand (a sleeper past the 2 s wall clock: timeout; an
early exit: error; a lookup table of the 4 shown examples: 4 of 6 tests). run_info.json
names bubblewrap, and step 2 samples from the weights synced after step 1."""
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from jaxrl_llm.rewards import GraderTimeout, code_reward
from jaxrl_llm.rewards.code_grader import CodeRunError
from jaxrl_llm.rewards.extract import extract_code_block
from jaxrl_llm.rollout import DiskWeightSync, VLLMClient, bridge_export
from jaxrl_llm.train.run.metrics import read_groups, read_metrics
from tests.rollout.code_task_vllm_run import PROMPTS, SAMPLES, WALL_S

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[2]


def grade_directly(text: str, tests: list[str]) -> tuple[float, str]:
    """(reward, verdict) of one completion by `code_reward` in this process: verdict "ok",
    "timeout" or "error", as the grader pool counts them."""
    example = SimpleNamespace(metadata={"tests": tests, "scoring": "fraction", "sandbox": {"wall_s": WALL_S}})
    try:
        return code_reward(text, example), "ok"
    except GraderTimeout:
        return 0.0, "timeout"
    except CodeRunError:
        return 0.0, "error"


@pytest.mark.slow  # ~3 min on 2 cores beside the shared server's start (SmolLM2 learner, 48-token programs)
@pytest.mark.timeout(1200)
def test_two_rl_steps_on_the_code_task_through_vllm_grade_what_the_server_wrote(vllm_server, smollm2, tmp_path):
    server = vllm_server.get()
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one device, as `jaxrl train` on a laptop
    env["PYTHONPATH"] = str(REPO)
    cmd = [sys.executable, "-m", "tests.rollout.code_task_vllm_run", server.url, smollm2.hf_dir, str(run_dir)]
    try:
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finally:  # the shared server goes back to the base weights for the other tests
        sync = DiskWeightSync(VLLMClient([server.url]), bridge_export(smollm2.cfg))
        sync.push(smollm2.params, version=0)
        sync.close()
    rows, groups = read_metrics(run_dir), read_groups(run_dir)
    calls = [json.loads(line) for line in (run_dir / "graded_texts.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and len(calls) == len(groups) == 2
    assert [r["weight_version"] for r in rows] == [0.0, 1.0]  # step 2 sampled from the synced weights
    sampled_blocks = 0
    for row, group, call in zip(rows, groups, calls):
        graded = [grade_directly(text, tests) for text, tests in zip(call["texts"], call["tests"])]
        rewards = np.array([r for r, _ in graded]).reshape(PROMPTS, SAMPLES)
        verdicts = [v for _, v in graded]
        assert verdicts[SAMPLES - 3:SAMPLES] == ["timeout", "error", "ok"]  # sleeper, early exit, lookup table
        assert rewards[0, SAMPLES - 1] == pytest.approx(4 / 6)  # the shown 4 of 4 + 2 hidden tests
        np.testing.assert_allclose(np.asarray(group["rewards"]), rewards, atol=1e-9)
        assert row["reward"] == pytest.approx(rewards.mean(), abs=1e-6)
        assert row["reward_timeouts"] == verdicts.count("timeout") and row["reward_errors"] == verdicts.count("error")
        own = [t for i, t in enumerate(call["texts"]) if not SAMPLES - 3 <= i < SAMPLES]
        sampled_blocks += sum(extract_code_block(t) is not None for t in own)
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["sandbox"]["tool"] == "bubblewrap"
    print(f"\nSmolLM2's own completions with a code block: {sampled_blocks} of {2 * (PROMPTS * SAMPLES - 3)}; "
          f"step rewards {[round(r['reward'], 3) for r in rows]}")
