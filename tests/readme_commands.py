"""The README's Commands block as a user reads it: the `jaxrl train` line that shows each capability
(issue 62, deliverable 7), as the argv a test runs. The tests run these lines, not copies of them, so a
README line that stops working fails a test."""
from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# capability -> the words that name its line in the Commands block (exactly one line holds them)
CAPABILITIES = {
    "moe_routing_replay": "--config experiments/moe_routing_replay.py",
    "code_task": "task.name=code_from_examples",
    "off_policy": "rollout.max_lag=",
    "gem": "--config experiments/gem_game.py",
    "verifiers": "--config experiments/verifiers_env.py",
    "judge": "--config experiments/judge.py",
}


def commands_block(text: str) -> list[str]:
    """The lines of the first ```bash block under the "## Commands" heading."""
    section = re.split(r"^## Commands$", text, maxsplit=1, flags=re.MULTILINE)[1]
    return section.split("```bash\n", 1)[1].split("\n```", 1)[0].splitlines()


def readme_line(capability: str, text: str | None = None) -> str:
    """The one Commands line that shows `capability`; ValueError naming the count otherwise."""
    words = CAPABILITIES[capability]
    found = [line for line in commands_block(README.read_text() if text is None else text) if words in line]
    if len(found) != 1:
        raise ValueError(f"README.md's Commands block has {len(found)} lines with {words!r} ({capability}); "
                         "valid: exactly one")
    return found[0]


def readme_argv(capability: str) -> list[str]:
    """That line as an argv run from the repository root: `jaxrl` is this interpreter's
    `python -m jaxrl_llm.cli`, the trailing comment dropped; the line must be a `jaxrl train`."""
    words = shlex.split(readme_line(capability), comments=True)
    if words[:2] != ["jaxrl", "train"]:
        raise ValueError(f"README line for {capability} is not a `jaxrl train` command: {words}")
    return [sys.executable, "-m", "jaxrl_llm.cli", *words[1:]]
