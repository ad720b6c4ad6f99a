"""Closed form of the length drift each aggregation mode implies when the reward does
not depend on length (docs/objectives.md#length-drift-on-a-length-neutral-task).

The setting: a response is an answer of `answer_tokens` tokens, graded alone, then
free tokens until EOS. After the answer the policy stops at each free position
with probability q = sigmoid(theta_c), where theta_c is a stop logit that may
depend on the answer's class c (right or wrong). At most K = max_tokens -
answer_tokens free positions fit; a response that has not stopped by then is
truncated. With j the number of free tokens (EOS included when it stopped):

  stopped at j (1 <= j <= K):  P = (1-q)^(j-1) q,  L = a + j,  s = d log P / d theta = 1 - q j
  truncated:                   P = (1-q)^K,        L = a + K,  s = -q K

(s is the score of the stop decisions; E[s] = 0.) At pi = pi_old the per-token
push of every recipe loss is dL/dlog pi_it = -w_it A_i (docs/objectives.md#length-bias),
so the expected ascent direction of theta_c in one step is

  g_c = sum_{i in c} A_i E[w_i s_i] = D_mode * sum_{i in c} A_i,

because the advantages depend on the answers only and the free lengths are
independent of them. D_mode = E[w s] for one response:

  constant (Dr. GRPO), seq_mean_token_sum (RLOO):  w does not depend on L  ->  D = 0
  seq_mean_token_mean (GRPO):  w = 1/(N L)          ->  D = E[s/L] / N > 0
  token_mean (DAPO):           w = 1/(L + S_rest)   ->  D = E[s/(L + S_rest)] > 0, ~1/N of GRPO's

(S_rest: the summed length of the step's N - 1 other kept responses, assumed to
follow the same stop probability.) D > 0 because s falls with L and so does w:
the covariance of a decreasing weight with the score is positive. Since the
group-centred advantages sum to zero, sum_{wrong} A < 0 < sum_{right} A: under
GRPO the stop logit after a wrong answer falls (wrong answers lengthen) and after
a right answer rises (right answers shorten), as Liu et al. 2025 (Dr. GRPO,
arXiv 2503.20783, section 3.1) describe; under a constant normaliser neither
moves in expectation; token-mean moves the same way as GRPO by about 1/N as much.
With SGD at learning rate eta the stop probability moves by eta q (1-q) g_c.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

UNBIASED_MODES = ("constant", "seq_mean_token_sum")
MODES = ("seq_mean_token_mean", "token_mean", *UNBIASED_MODES)


class FreeLengths(NamedTuple):
    """The outcomes of the free part: probability, response length and stop-logit score."""
    prob: np.ndarray  # [K + 1]: stopped after 1..K free tokens, then truncated
    length: np.ndarray  # [K + 1] L = answer_tokens + free tokens
    score: np.ndarray  # [K + 1] d log P / d theta
    truncated: np.ndarray  # [K + 1] bool


def free_lengths(q: float, answer_tokens: int, max_tokens: int) -> FreeLengths:
    """The truncated-geometric distribution of the free part (module docstring)."""
    if not 0 < q < 1:
        raise ValueError(f"stop probability q={q!r} is invalid; valid: 0 < q < 1")
    free = max_tokens - answer_tokens
    if answer_tokens < 0 or free < 1:
        raise ValueError(f"answer_tokens={answer_tokens}, max_tokens={max_tokens}: valid: "
                         f"0 <= answer_tokens < max_tokens")
    j = np.arange(1, free + 1, dtype=np.float64)
    prob = np.append((1 - q) ** (j - 1) * q, (1 - q) ** free)
    length = np.append(answer_tokens + j, answer_tokens + free)
    score = np.append(1 - q * j, -q * free)
    truncated = np.append(np.zeros(free, bool), True)
    return FreeLengths(prob, length, score, truncated)


def _rest_length_pmf(lengths: FreeLengths, others: int) -> np.ndarray:
    """pmf of the summed length of `others` iid responses, indexed by total length."""
    single = np.zeros(int(lengths.length.max()) + 1)
    np.add.at(single, lengths.length.astype(int), lengths.prob)
    total = np.array([1.0])
    for _ in range(others):
        total = np.convolve(total, single)
    return total


def expected_weighted_score(mode: str, q: float, *, answer_tokens: int, max_tokens: int, num_responses: int,
                            constant_length: float | None = None) -> float:
    """D_mode = E[w_i s_i] of one response (module docstring): the expected push on the stop
    logit per unit advantage. `num_responses` = N, the responses the weights are normalised
    over (after filters); `constant_length` only for 'constant'."""
    if mode not in MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; valid: {', '.join(MODES)}")
    if num_responses < 1:
        raise ValueError(f"num_responses={num_responses}; valid: >= 1")
    out = free_lengths(q, answer_tokens, max_tokens)
    if mode in UNBIASED_MODES:
        scale = 1.0 / num_responses if mode == "seq_mean_token_sum" else 1.0 / (num_responses * constant_length)
        return float(scale * np.sum(out.prob * out.score))  # = 0 up to rounding: E[s] = 0
    if mode == "seq_mean_token_mean":
        return float(np.sum(out.prob * out.score / out.length)) / num_responses
    rest = _rest_length_pmf(out, num_responses - 1)
    totals = out.length[:, None] + np.arange(rest.size)[None, :]
    return float(np.sum(out.prob[:, None] * rest[None, :] * out.score[:, None] / totals))


def expected_weight(mode: str, q: float, *, answer_tokens: int, max_tokens: int, num_responses: int,
                    constant_length: float | None = None) -> float:
    """E[w_i], the mean per-token weight of the mode: D / E[w] is the stop-logit push
    relative to the mode's own step size, comparable across modes."""
    out = free_lengths(q, answer_tokens, max_tokens)
    if mode == "seq_mean_token_mean":
        return float(np.sum(out.prob / out.length)) / num_responses
    if mode == "token_mean":
        rest = _rest_length_pmf(out, num_responses - 1)
        totals = out.length[:, None] + np.arange(rest.size)[None, :]
        return float(np.sum(out.prob[:, None] * rest[None, :] / totals))
    if mode == "seq_mean_token_sum":
        return 1.0 / num_responses
    if mode == "constant":
        return 1.0 / (num_responses * constant_length)
    raise ValueError(f"unknown aggregation mode {mode!r}; valid: {', '.join(MODES)}")


class StopDrift(NamedTuple):
    """Expected ascent direction of the stop logit after a right / a wrong answer in one step."""
    right: float
    wrong: float


def expected_stop_drift(mode: str, q: float, advantages: np.ndarray, correct: np.ndarray, *,
                        answer_tokens: int, max_tokens: int, num_responses: int | None = None,
                        constant_length: float | None = None) -> StopDrift:
    """g_c = D_mode * sum_{i in c} A_i for the step's advantages [N] and correctness [N]
    (rows masked out by a filter have A = 0 and are not counted in `num_responses`)."""
    advantages = np.asarray(advantages, np.float64).reshape(-1)
    correct = np.asarray(correct, bool).reshape(-1)
    n = int(num_responses if num_responses is not None else advantages.size)
    d = expected_weighted_score(mode, q, answer_tokens=answer_tokens, max_tokens=max_tokens, num_responses=n,
                                constant_length=constant_length)
    return StopDrift(right=d * float(advantages[correct].sum()), wrong=d * float(advantages[~correct].sum()))


def relative_push(mode: str, q: float, *, answer_tokens: int, max_tokens: int, num_responses: int,
                  constant_length: float | None = None) -> float:
    """D / E[w]: the stop-logit push per unit advantage in units of the mode's mean per-token
    weight (GRPO ~ q Var(j) / E[L]; token-mean ~ that / N; constant 0)."""
    kwargs = dict(answer_tokens=answer_tokens, max_tokens=max_tokens, num_responses=num_responses,
                  constant_length=constant_length)
    return expected_weighted_score(mode, q, **kwargs) / expected_weight(mode, q, **kwargs)
