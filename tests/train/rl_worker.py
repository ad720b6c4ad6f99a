"""Child process for the kill -9 / --resume tests of the KL and critic runs.

    python -m tests.train.rl_worker CONFIG_JSON [--resume]

Trains with `loop.train` on the configured task, graded by `parity_reward` (1 when the
decoded completion has an even number of characters), so a tiny random model gets
non-zero advantages and its policy, reference KL and critic all move.
"""
import sys

from jaxrl_llm.train.run import loop
from jaxrl_llm.train.config import load_config_json
from jaxrl_llm.train.sample.prompts import task_from_config


def parity_reward(completion: str, example) -> float:
    return float(len(completion) % 2 == 0)


parity_reward.trusted_in_process = True


def main(config_path: str, resume: bool) -> None:
    cfg = load_config_json(config_path)
    task = task_from_config(cfg)
    task.reward_fn = parity_reward
    loop.train(cfg, task=task, resume=resume)


if __name__ == "__main__":
    main(sys.argv[1], "--resume" in sys.argv[2:])
