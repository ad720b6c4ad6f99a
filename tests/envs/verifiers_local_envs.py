"""Locally defined verifiers environments (the 0.3 classic API), as a user brings them:
``task.kwargs.env_id = "tests.envs.verifiers_local_envs:load_<name>"``. Their data sets are
a few rows made here; no download."""
import verifiers as vf
from datasets import Dataset

SYSTEM = "Answer in one word."
ROWS = [{"question": f"Spell the word {w!r} backwards.", "answer": w[::-1]}
        for w in ("cat", "horse", "apple", "river", "stone", "cloud", "maple", "tiger")]


def overlap(completion, answer) -> float:
    """The share of the answer's letters that the last reply uses."""
    text = completion[-1].content or ""
    return len(set(answer) & set(text)) / len(set(answer))


def brevity(completion) -> float:
    """1 for an empty reply, down to 0 at 400 characters or more (8 random tokens are ~50)."""
    return max(0.0, 1.0 - len(completion[-1].content or "") / 400)


WEIGHTS = (1.0, 0.5)


def reverse_reward_by_hand(text: str, answer: str) -> float:
    """load_reverse's rubric worked by hand on a reply's text: 1.0 * letter overlap + 0.5 * brevity."""
    return len(set(answer) & set(text)) / len(set(answer)) + 0.5 * max(0.0, 1.0 - len(text) / 400)


def load_reverse(rows: int = len(ROWS)) -> vf.SingleTurnEnv:
    """A SingleTurnEnv on a local data set, with a two-function weighted rubric."""
    rubric = vf.Rubric(funcs=[overlap, brevity], weights=list(WEIGHTS))
    return vf.SingleTurnEnv(dataset=Dataset.from_list(ROWS[:rows]), system_prompt=SYSTEM, rubric=rubric)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


SUMS = [{"question": f"What is {a} + {b}? Use the add tool.", "answer": str(a + b)}
        for a, b in ((17, 25), (3, 4), (120, 5), (9, 9))]


def exact_answer(completion, answer) -> float:
    return float((completion[-1].content or "").strip() == answer)


def load_adder(max_turns: int = 4) -> vf.ToolEnv:
    """A ToolEnv with one Python function tool; the reward: the last reply is the sum."""
    return vf.ToolEnv(dataset=Dataset.from_list(SUMS), tools=[add], max_turns=max_turns,
                      rubric=vf.Rubric(funcs=[exact_answer]))


class CountdownEnv(vf.MultiTurnEnv):
    """Answers every turn with "Again (k left)." until max_turns; the reward: turns played / max_turns."""

    async def env_response(self, messages, state, **kwargs):
        return [vf.UserMessage(content=f"Again ({self.max_turns - len(state['trajectory'])} left).")]


def turns_played(state) -> float:
    return len(state["trajectory"]) / 3


def load_countdown() -> CountdownEnv:
    return CountdownEnv(dataset=Dataset.from_list(ROWS), max_turns=3, rubric=vf.Rubric(funcs=[turns_played]))
