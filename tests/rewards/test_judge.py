"""The LLM judge reward's own logic (rewards/judge.py), without a server: the score format, the rubric's
refusals, malformed answers, failed requests, the cache and the weighted sum. The judge model is replaced by
`FakeJudge`, a table of planted answers that counts the prompts it is sent (the real server's answers are
tests/rollout/test_judge_vllm.py's)."""
from __future__ import annotations

import dataclasses

import pytest

from jaxrl_llm.rewards import GraderPool, JudgeReward, ScoreFormat, WeightedRewards, exact_match_reward, judge_prompt

RUBRIC = "Q: {prompt}\nA: {response}\nGrade it. End with Score: <0-10>"
FORMAT = ScoreFormat.parse("Score: <0-10>")


@dataclasses.dataclass
class Ex:
    prompt: str
    answer: str = ""
    metadata: dict = dataclasses.field(default_factory=dict)


class FakeJudge:
    """A fake judge model: the answer to a judge prompt is looked up by the response it holds (the text
    after "A: " up to the newline); counts every prompt sent."""

    def __init__(self, answers: dict[str, str | BaseException]):
        self.answers = answers
        self.sent: list[str] = []

    def __call__(self, prompts):
        self.sent += prompts
        return [self.answers[p.split("A: ", 1)[1].split("\n", 1)[0]] for p in prompts]


@pytest.mark.parametrize("answer, score", [
    ("Score: 8", 8), ("reasons... Score: 3 and then Score: 9", 9), ("**Score:** 7", 7), ("score: <6>", 6),
    ("Score: 10", 10), ("Score: 0", 0), ("Score: 11", None), ("Score: -1", None), ("Score: 7.5", None),
    ("Score: <0-10>", None), ("The answer is right.", None), ("Score:", None)])
def test_score_format_reads_the_last_labelled_integer_in_range(answer, score):
    assert FORMAT.score(answer) == score


def test_score_format_parse_and_reward():
    fmt = ScoreFormat.parse("Rating: <1-5>")
    assert (fmt.label, fmt.low, fmt.high, fmt.text) == ("Rating:", 1, 5, "Rating: <1-5>")
    assert [fmt.reward(s) for s in (1, 2, 5)] == [0.0, 0.25, 1.0]  # (s - 1) / 4 by hand
    for bad in ("Score 0-10", "<0-10>", "Score: <10-0>", "Score: <3-3>", ""):
        with pytest.raises(ValueError, match="valid: a label and an integer range"):
            ScoreFormat.parse(bad)


def test_rubric_must_hold_the_response_and_the_format():
    with pytest.raises(ValueError, match="does not state the score format 'Score: <0-10>'"):
        JudgeReward("Q: {prompt} A: {response}. Give a score.", FORMAT)
    with pytest.raises(ValueError, match=r"no \{response\} placeholder"):
        JudgeReward("Grade it. Score: <0-10>", FORMAT)


def test_judge_prompt_fills_each_placeholder_once():
    assert judge_prompt(RUBRIC, "2+2?", "a {prompt} b") == "Q: 2+2?\nA: a {prompt} b\nGrade it. End with Score: <0-10>"


def test_rewards_malformed_and_failed_requests():
    fake = FakeJudge({"4": "Correct. Score: 10", "5": "Score: 2", "five": "I think it is fine.",
                      "slow": TimeoutError("no answer within 1 s"), "down": ConnectionError("refused")})
    judge = JudgeReward(RUBRIC, FORMAT).connect(fake)
    texts = ["4", "5", "five", "slow", "down"]
    result = judge.grade_batch(None, texts, [Ex("2+2?")] * 5)
    assert result.rewards == (1.0, 0.2, 0.0, 0.0, 0.0)
    assert result.statuses == ("ok", "ok", "error", "timeout", "error")
    assert (result.n_errors, result.n_timeouts) == (2, 1)
    assert "states no 'Score: <0-10>'" in result.errors[0] and "I think it is fine." in result.errors[0]
    assert result.metrics == {"judge_calls": 5.0, "judge_cache_hits": 0.0, "judge_malformed": 1.0,
                              "judge_timeouts": 1.0, "judge_errors": 1.0}


def test_cache_one_request_per_distinct_judge_prompt():
    fake = FakeJudge({"4": "Score: 10", "5": "Score: 2", "five": "no idea", "slow": TimeoutError("late")})
    judge = JudgeReward(RUBRIC, FORMAT).connect(fake)
    first = judge.grade_batch(None, ["4", "4", "5", "five", "slow"], [Ex("2+2?")] * 5)
    assert len(fake.sent) == 4  # "4" twice in the batch: one request
    second = judge.grade_batch(None, ["5", "4", "five", "slow"], [Ex("2+2?")] * 4)
    assert len(fake.sent) == 5  # only the timed-out one is asked again; the malformed answer is remembered
    assert second.rewards == (0.2, 1.0, 0.0, 0.0) and first.rewards == (1.0, 1.0, 0.2, 0.0, 0.0)
    assert second.metrics["judge_cache_hits"] == 3 and second.metrics["judge_calls"] == 1
    judge.grade_batch(None, ["4"], [Ex("3+1?")])  # another question: another judge prompt
    assert len(fake.sent) == 6


def test_cache_size_bounds_the_remembered_verdicts():
    fake = FakeJudge({str(i): f"Score: {i}" for i in range(5)})
    judge = JudgeReward(RUBRIC, FORMAT, cache_size=2).connect(fake)
    judge.grade_batch(None, ["0", "1", "2"], [Ex("q")] * 3)
    judge.grade_batch(None, ["2", "0"], [Ex("q")] * 2)  # "2" kept, "0" dropped first
    assert len(fake.sent) == 4 and fake.sent[-1].split("A: ")[1].startswith("0")


def test_through_the_pool_alone_and_weighted():
    """The GraderPool hands the judge (and a weighted sum holding it) the whole batch; the weighted sum is
    sum_k w_k r_k answer by answer, computed here by hand."""
    fake = FakeJudge({"4": "Score: 10", "5": "Score: 5", "x": "nothing"})
    judge = JudgeReward(RUBRIC, FORMAT).connect(fake)
    weighted = WeightedRewards(("judge", "exact"), (judge, exact_match_reward), (0.5, 2.0))
    examples = [Ex("2+2?", answer="4")] * 3
    with GraderPool(1, timeout_s=10) as pool:
        alone = pool.grade(judge, ["4", "5", "x"], examples)
        both = pool.grade(weighted, ["4", "5", "x"], examples)
        assert pool.worker_pids == ()  # no worker started: exact_match is trusted in process, the judge is batched
    assert alone.rewards == (1.0, 0.5, 0.0)
    assert both.rewards == (0.5 * 1.0 + 2.0 * 1.0, 0.5 * 0.5 + 0.0, 0.0)
    assert both.statuses == ("ok", "ok", "error") and both.n_errors == 1
    assert both.metrics["judge_malformed"] == 0 and both.metrics["judge_cache_hits"] == 3  # asked by `alone` already
    assert weighted("4", examples[0]) == 2.5  # per answer too (evaluation's path)


def test_unconnected_judge_says_so():
    with pytest.raises(RuntimeError, match="not connected"):
        JudgeReward(RUBRIC, FORMAT).grade_batch(None, ["4"], [Ex("q")])
