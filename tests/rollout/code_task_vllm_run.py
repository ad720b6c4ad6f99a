"""Child process for test_code_task_vllm.py: two RL steps on the code task (`code_from_examples`)
with SmolLM2-135M sampling on the real vLLM CPU server, the learner in this process (one CPU
device, as `jaxrl train` runs on a laptop).

The loop's own grading stays in place (`train.sample.stage.grade`: the grader pool, each
program in the bubblewrap sandbox); this process only wraps it to (1) put three planted
programs in the first group's last three slots, a sleeper past the sandbox's wall-clock limit,
one that exits before its tests and a lookup table of the shown examples, and (2) record every
completion the loop graded, with its example's tests, in RUN_DIR/graded_texts.jsonl (one line
per grading call, in call order), so the test can grade them again by another path.

    python -m tests.rollout.code_task_vllm_run SERVER_URL MODEL_DIR RUN_DIR
"""
import json
import re
import sys
from pathlib import Path

from jaxrl_llm.train.config import load_config
from jaxrl_llm.train.run import loop
from jaxrl_llm.train.sample import stage as sampling

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "experiments/demo.py"
WALL_S = 2
SLEEPER = "```python\nimport time\ntime.sleep(60)\n```"
EXITER = "```python\nimport os\nos._exit(0)\n```"
PROMPTS, SAMPLES = 2, 4


def lookup_table(prompt: str) -> str:
    """A program that returns the prompt's shown examples and nothing else (None elsewhere)."""
    pairs = re.findall(r"^f\((.*)\) == (.*)$", prompt, re.MULTILINE)
    table = ", ".join(f"repr({arg}): {out}" for arg, out in pairs)
    return f"```python\ndef f(x):\n    return {{{table}}}.get(repr(x))\n```"


def overrides(url: str, model_dir: str, run_dir: str) -> list[str]:
    """2 steps of 2 prompts x 4 samples of up to 48 tokens on code_from_examples (4 shown and 2
    hidden tests per question, fraction scoring, the sandbox's wall clock at WALL_S)."""
    return ["total_steps=2", "rollout.engine=vllm", f"rollout.server_urls=[{url}]",
            f"rollout.prompts_per_step={PROMPTS}", f"rollout.samples_per_prompt={SAMPLES}", "rollout.max_tokens=48",
            "train.micro_batch_size=4", "checkpoint.every_steps=0", "checkpoint.async_save=false",
            "metrics.tensorboard=false", f"run_dir={run_dir}", f"model.source={model_dir}",
            "task.name=code_from_examples", f'task.kwargs={{"n_hidden": 2, "sandbox": {{"wall_s": {WALL_S}}}}}',
            "task.reward_timeout_s=10", "task.eval_every=0"]


def main(url: str, model_dir: str, run_dir: str) -> None:
    cfg = load_config(str(CONFIG), overrides(url, model_dir, run_dir))
    record = Path(run_dir) / "graded_texts.jsonl"
    real_grade = sampling.grade

    def planted_and_recorded(pool, task, texts, examples, samples_per_prompt):
        texts = list(texts)
        texts[SAMPLES - 3:SAMPLES] = [SLEEPER, EXITER, lookup_table(examples[0].prompt)]
        tests = [e.metadata["tests"] for e in examples for _ in range(samples_per_prompt)]
        with open(record, "a") as f:
            f.write(json.dumps({"texts": texts, "tests": tests}) + "\n")
        return real_grade(pool, task, texts, examples, samples_per_prompt)

    sampling.grade = planted_and_recorded
    out = loop.train(cfg)
    print(json.dumps({"step": out.step}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
