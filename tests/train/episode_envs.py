"""Environments named by tests through task.env ("tests.train.episode_envs:ParityEnv")."""
from jaxrl_llm.data.environments import StepResult


class ParityEnv:
    """Two turns; each reply scores 1 when its text has an even number of characters, so a
    tiny random model gets non-zero advantages and its policy moves."""

    def __init__(self, turns: int = 2):
        self.turns, self.played = turns, 0

    def reset(self, example):
        return example.prompt, {}

    def step(self, action_text):
        self.played += 1
        reward = float(len(action_text) % 2 == 0)
        return StepResult("Again." if self.played < self.turns else "", reward, self.played >= self.turns)
