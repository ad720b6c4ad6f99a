"""The LLM judge of a task, `task.judge` (re-exported by train/config/schema.py): which model judges,
with which rubric, and how it states its score. The reward itself is rewards/judge.py; its server and
client are set up by train/sample/judge.py.

    task.judge.model=smollm2                         the judge alone is the reward
    task.judge.model=/models/judge task.reward_fns='["judge", "exact"]' task.reward_weights='[0.5, 1.0]'

The rubric holds {response} (the policy's answer), optionally {prompt} (the task's question), and the
score format verbatim ("Score: <0-10>"); a rubric that does not state the format is refused here, since
the judge could not know how to answer. Each answer's reward is (score - low) / (high - low), in [0, 1].
"""
from __future__ import annotations

import dataclasses
from typing import Literal

from jaxrl_llm.rewards import ScoreFormat, check_rubric
from jaxrl_llm.utils.typed_config import ConfigError, Section, field

DEFAULT_RUBRIC = (
    "You are grading an answer to a question.\n\n"
    "Question:\n{prompt}\n\n"
    "Answer:\n{response}\n\n"
    "Is the answer correct? Reply with one line: Score: <0-10>, where 10 means fully correct and 0 means wrong.")
DEFAULT_FORMAT = "Score: <0-10>"


@dataclasses.dataclass(frozen=True)
class JudgeConfig(Section):
    """A judge model served by vLLM (a second server, or running servers named in server_urls) that scores
    each response with a rubric. Off while `model` is None."""

    # "smollm2", an HF directory (config.json, *.safetensors, tokenizer with a chat_template) or a .gguf file
    model: str | None = None
    rubric: str = DEFAULT_RUBRIC  # {prompt}, {response}, and the score format verbatim
    score_format: str = DEFAULT_FORMAT  # "LABEL <LOW-HIGH>": the answer's last "LABEL N" is the score
    # Running vLLM servers that serve the judge; empty: the run starts one on 127.0.0.1 (never the policy's own:
    # its weights change every step).
    server_urls: tuple[str, ...] = ()
    server_dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    max_model_len: int = field(2048, ge=16)  # of the server the run starts: rubric + question + response + max_tokens
    max_tokens: int = field(64, ge=1)  # of the judge's answer
    temperature: float = field(0.0, ge=0.0)  # 0: greedy, the same answer to the same judge prompt
    timeout_s: float = field(60.0, gt=0.0)  # per request; past it (after max_retries) the answer scores 0, counted
    max_retries: int = field(1, ge=0)
    max_concurrency: int = field(16, ge=1)  # requests in flight
    cache_size: int = field(65536, ge=0)  # judge prompts whose verdicts are kept
    _path_prefix = "task.judge."

    @property
    def enabled(self) -> bool:
        return self.model is not None

    def _check_consistency(self) -> None:
        try:
            fmt = ScoreFormat.parse(self.score_format)
        except ValueError as err:
            raise ConfigError(f"task.judge.score_format: {err}") from None
        try:
            check_rubric(self.rubric, fmt)
        except ValueError as err:
            raise ConfigError(f"task.judge.rubric: {err}") from None
        if self.model is None and self.server_urls:
            raise ConfigError(f"task.judge.server_urls = {list(self.server_urls)!r} is set without task.judge.model; "
                              "valid: task.judge.model naming the judge those servers serve")
