"""An LLM judge as a reward (`task.judge`): a rubric prompt filled with the question and the
response, sent to a judge model, whose answer must state a score in a declared format.

    fmt = ScoreFormat.parse("Score: <0-10>")
    judge = JudgeReward(RUBRIC, fmt)            # the rubric holds {prompt}, {response} and "Score: <0-10>"
    judge.connect(client.complete)              # texts -> answers (rollout/judge_client.py)
    result = judge.grade_batch(pool, completions, examples)   # a GradeResult; rewards in [0, 1]

Plain Python: the HTTP client is handed in (`complete`: judge prompts -> for each, the judge's
text, or the exception that stopped it; a `TimeoutError` counts as a timeout), so this package
imports nothing above core (docs/architecture.md).

What each answer gets:
  - the judge's text holds the format's label followed by a number in range (the last such one
    counts): reward (score - low) / (high - low), in [0, 1];
  - no such score (missing, out of range): reward 0, counted as malformed (`judge_malformed`)
    and as a grader error;
  - the request timed out: reward 0, counted as a timeout; any other failure: reward 0, an error.
Same judge prompt (rubric + question + response), same answer: a cache keyed by the prompt's
SHA-256 holds the verdicts of answers that came back (malformed ones too: the judge is greedy by
default, so asking again would give the same text); a failed request is asked again next time.
Within a batch each distinct judge prompt is sent once. Each batch's `GradeResult.metrics` holds
judge_calls (prompts sent), judge_cache_hits (distinct prompts answered from the cache),
judge_malformed, judge_timeouts and judge_errors (failed requests); `JudgeReward.counts` sums them.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import re
from typing import Any, Callable, Sequence

from jaxrl_llm.rewards.grade_result import Collector, GradeResult

PROMPT, RESPONSE = "{prompt}", "{response}"  # the rubric's placeholders (plain text, not str.format)
FORMAT_HELP = "a label and an integer range in angle brackets, e.g. 'Score: <0-10>'"

# judge prompts -> per prompt the judge's text, or the exception that stopped its request
Complete = Callable[[Sequence[str]], Sequence["str | BaseException"]]


@dataclasses.dataclass(frozen=True)
class ScoreFormat:
    """How the judge states its score: `label` then an integer in [low, high], e.g. "Score: 7"."""

    label: str
    low: int
    high: int

    @classmethod
    def parse(cls, spec: str) -> "ScoreFormat":
        """The format of "LABEL <LOW-HIGH>" (e.g. "Score: <0-10>"); ValueError naming `spec` otherwise."""
        match = re.fullmatch(r"\s*(\S.*?)\s*<\s*(-?\d+)\s*-\s*(-?\d+)\s*>\s*", spec or "")
        if match is None:
            raise ValueError(f"score format {spec!r} is not a label followed by <LOW-HIGH>; valid: {FORMAT_HELP}")
        low, high = int(match.group(2)), int(match.group(3))
        if not low < high:
            raise ValueError(f"score format {spec!r} has low {low} >= high {high}; valid: {FORMAT_HELP}")
        return cls(match.group(1), low, high)

    @property
    def text(self) -> str:
        """The format as the rubric must state it: "Score: <0-10>"."""
        return f"{self.label} <{self.low}-{self.high}>"

    def score(self, answer: str) -> int | None:
        """N of the last "LABEL N" in `answer` (case ignored; spaces, markdown's * and a '<' allowed
        between) if N is an integer in [low, high]; else None (missing, out of range, a decimal such
        as 7.5). The format echoed ("Score: <0-10>") is no "LABEL N"."""
        found = re.findall(re.escape(self.label) + r"[\s*<]*(-?\d+(?:\.\d+)?)(?!\d|\s*-\s*\d)", answer, re.IGNORECASE)
        if not found or not re.fullmatch(r"-?\d+", found[-1]):
            return None
        value = int(found[-1])
        return value if self.low <= value <= self.high else None

    def reward(self, score: int) -> float:
        return (score - self.low) / (self.high - self.low)


def check_rubric(rubric: str, score_format: ScoreFormat) -> None:
    """ValueError unless the rubric holds {response} and states the score format verbatim."""
    if RESPONSE not in rubric:
        raise ValueError(f"rubric {rubric[:80]!r} has no {RESPONSE} placeholder; valid: a rubric holding {RESPONSE} "
                         f"(and {PROMPT}, optionally) and the score format {score_format.text!r}")
    if score_format.text not in rubric:
        raise ValueError(f"rubric {rubric[:80]!r} does not state the score format {score_format.text!r}; valid: a "
                         f"rubric that tells the judge to answer with {score_format.text!r}, verbatim")


def judge_prompt(rubric: str, prompt: str, response: str) -> str:
    """The user message sent to the judge: the rubric with {prompt} and {response} replaced (each once,
    in one pass, so a response that contains "{prompt}" stays as written)."""
    parts = {PROMPT: prompt, RESPONSE: response}
    return re.sub(r"\{prompt\}|\{response\}", lambda m: parts[m.group(0)], rubric)


@dataclasses.dataclass
class JudgeCounts:
    """What the judge did, cumulative: requests sent, answers taken from the cache, malformed answers,
    timeouts and other failed requests."""

    calls: int = 0
    cache_hits: int = 0
    malformed: int = 0
    timeouts: int = 0
    errors: int = 0

    def metrics(self) -> dict[str, float]:
        return {f"judge_{k}": float(v) for k, v in dataclasses.asdict(self).items()}

    def minus(self, earlier: "JudgeCounts") -> "JudgeCounts":
        return JudgeCounts(*(a - b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(earlier))))


@dataclasses.dataclass(frozen=True)
class _Verdict:
    score: int | None  # None: malformed
    answer: str


class JudgeReward:
    """The judge as a grader: graded a batch at a time (`grade_batch`, which the GraderPool calls in
    place of per-answer workers), in this process, through the `complete` function `connect` hands it.

    Args:
      rubric: the judge's instructions, holding {response}, optionally {prompt} (the task's question,
        `example.prompt`), and the score format verbatim.
      score_format: how the judge states its score.
      cache_size: most judge prompts whose verdicts are kept (oldest dropped first).
    """

    grades_in_batches = True

    def __init__(self, rubric: str, score_format: ScoreFormat, *, cache_size: int = 65536):
        check_rubric(rubric, score_format)
        self.rubric = rubric
        self.score_format = score_format
        self.cache_size = int(cache_size)
        self.complete: Complete | None = None
        self.counts = JudgeCounts()
        self._cache: collections.OrderedDict[bytes, _Verdict] = collections.OrderedDict()

    def connect(self, complete: Complete) -> "JudgeReward":
        self.complete = complete
        return self

    def __call__(self, completion: str, example: Any) -> float:
        """One answer's reward (a batch of one); raises what the batch recorded as failed."""
        result = self.grade_batch(None, [completion], [example])
        if result.statuses[0] != "ok":
            raise RuntimeError(result.errors[0])
        return result.rewards[0]

    def grade_batch(self, pool, completions: Sequence[str], examples: Sequence[Any]) -> GradeResult:
        """The judge's rewards of completions[i] answering examples[i].prompt (`pool` is not used: the
        judge is one HTTP client in this process)."""
        if len(completions) != len(examples):
            raise ValueError(f"got {len(completions)} completions but {len(examples)} examples; valid: one each")
        if self.complete is None:
            raise RuntimeError("the judge is not connected to a server (JudgeReward.connect); the run's set-up "
                               "does that for task.judge (train/sample/judge.py)")
        prompts = [judge_prompt(self.rubric, example.prompt, text) for text, example in zip(completions, examples)]
        keys = [hashlib.sha256(p.encode()).digest() for p in prompts]
        before = dataclasses.replace(self.counts)
        collector = Collector(len(prompts), (0.0, 1.0))  # its wall time starts here
        outcomes = self._ask(dict(zip(keys, prompts)))
        for index, key in enumerate(keys):
            outcome = outcomes[key]
            if isinstance(outcome, TimeoutError):
                collector.grader_timeout(index, f"judge request timed out: {outcome}"[:500])
            elif isinstance(outcome, BaseException):
                collector.error(index, f"judge request failed: {type(outcome).__name__}: {outcome}"[:500])
            elif outcome.score is None:
                collector.error(index, f"judge answer states no {self.score_format.text!r}: {outcome.answer!r:.200}")
            else:
                collector.ok(index, self.score_format.reward(outcome.score))
        return dataclasses.replace(collector.result(), metrics=self.counts.minus(before).metrics())

    def _ask(self, prompts: dict[bytes, str]) -> dict[bytes, "_Verdict | BaseException"]:
        """Each distinct judge prompt's verdict (by its key): from the cache, else asked once (answers cached,
        failures not)."""
        outcomes: dict[bytes, _Verdict | BaseException] = {k: self._cache[k] for k in prompts if k in self._cache}
        todo = [k for k in prompts if k not in outcomes]
        answers = list(self.complete([prompts[k] for k in todo])) if todo else []
        if len(answers) != len(todo):
            raise RuntimeError(f"the judge client answered {len(answers)} of {len(todo)} prompts")
        self.counts.calls += len(todo)
        self.counts.cache_hits += len(outcomes)
        for key, answer in zip(todo, answers):
            if isinstance(answer, BaseException):
                outcomes[key] = answer
                self.counts.timeouts += isinstance(answer, TimeoutError)
                self.counts.errors += not isinstance(answer, TimeoutError)
                continue
            outcomes[key] = verdict = _Verdict(self.score_format.score(answer), answer)
            self.counts.malformed += verdict.score is None
            self._remember(key, verdict)
        return outcomes

    def _remember(self, key: bytes, verdict: _Verdict) -> None:
        self._cache[key] = verdict
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)


def grades_in_batches(reward_fn: Any) -> bool:
    """Whether `reward_fn` grades whole batches in the calling process (`grade_batch(pool, completions,
    examples)`): the judge, and weighted rewards with a judge among their parts."""
    return bool(getattr(reward_fn, "grades_in_batches", False))
