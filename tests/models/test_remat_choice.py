"""Choosing the remat mode from the compiled program's memory estimate (models/remat.py: "auto")."""
from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
import pytest

from jaxrl_llm.models import DecoderConfig, init_params, token_logprobs
from jaxrl_llm.models.remat import (REMAT_CHOICES, REMAT_MODES, RematChoice, choose_remat, device_memory_budget,
                                    program_bytes, remat_setting)

# Activations dominate at this shape (4 layers, width 64, B=8, T=256): on XLA:CPU off ~122 MB,
# dots ~49 MB, full ~38 MB, against ~0.65 MB of params.
CFG = DecoderConfig.from_hf(dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                 num_attention_heads=4, num_key_value_heads=2, architectures=["LlamaForCausalLM"],
                                 model_type="llama"))
BATCH, LENGTH = 8, 256


@functools.lru_cache(maxsize=None)
def _compiled(mode: str):
    params = init_params(CFG, jax.random.PRNGKey(0))
    tokens = jnp.zeros((BATCH, LENGTH), jnp.int32)
    grad = jax.grad(lambda p, t: -jnp.mean(token_logprobs(p, CFG, t, remat=mode)))
    return jax.jit(grad).lower(params, tokens).compile()


@functools.lru_cache(maxsize=1)
def _estimates() -> dict[str, int]:
    return {m: program_bytes(_compiled(m)) for m in REMAT_MODES}


class _Counting:
    """compile_mode that records which modes were compiled."""

    def __init__(self):
        self.calls: list[str] = []

    def __call__(self, mode):
        self.calls.append(mode)
        return _compiled(mode)


def test_program_bytes_is_the_sum_of_the_memory_analysis():
    stats = _compiled("off").memory_analysis()
    want = (stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
            + stats.generated_code_size_in_bytes - stats.alias_size_in_bytes)
    assert program_bytes(_compiled("off")) == want > 0


def test_program_bytes_without_analysis_raises():
    class NoAnalysis:
        def memory_analysis(self):
            return None
    with pytest.raises(ValueError, match="no memory analysis"):
        program_bytes(NoAnalysis())


def test_remat_lowers_the_estimate():
    est = _estimates()
    assert est["off"] > est["dots"] >= est["full"]
    assert est["off"] > 2 * est["full"]  # activations dominate at this shape


def test_big_budget_picks_off_and_compiles_only_off(caplog):
    est = _estimates()
    counting = _Counting()
    with caplog.at_level(logging.INFO, logger="jaxrl_llm.models.remat"):
        choice = choose_remat(counting, est["off"] + 1)
    assert isinstance(choice, RematChoice)
    assert choice.mode == "off" and counting.calls == ["off"]
    assert choice.estimates == {"off": est["off"]} and choice.budget == est["off"] + 1
    assert "chose 'off'" in caplog.text


def test_budget_exactly_off_fits():
    assert choose_remat(_Counting(), _estimates()["off"]).mode == "off"


def test_middle_budget_picks_the_first_that_fits():
    est = _estimates()
    budget = (est["off"] + est["full"]) // 2
    expected = next(m for m in REMAT_MODES if est[m] <= budget)  # derived from the estimates alone
    counting = _Counting()
    choice = choose_remat(counting, budget)
    assert choice.mode == expected != "off"
    assert choice.estimates[choice.mode] <= budget
    assert counting.calls == list(REMAT_MODES[:REMAT_MODES.index(expected) + 1])


def test_budget_between_full_and_dots_picks_full():
    est = _estimates()
    if est["dots"] == est["full"]:
        pytest.skip("dots and full estimate the same bytes here")
    choice = choose_remat(_Counting(), est["full"])
    assert choice.mode == "full" and "may not fit" not in choice.reason
    assert list(choice.estimates) == ["off", "dots", "full"]


def test_budget_below_all_returns_full_saying_it_may_not_fit():
    est = _estimates()
    counting = _Counting()
    choice = choose_remat(counting, est["full"] - 1)
    assert choice.mode == "full" and counting.calls == list(REMAT_MODES)
    assert "may not fit" in choice.reason and str(est["full"]) in choice.reason


def test_no_budget_returns_the_fallback_without_compiling():
    counting = _Counting()
    choice = choose_remat(counting, None, fallback="dots")
    assert choice == RematChoice("dots", {}, None, choice.reason) and counting.calls == []
    assert choose_remat(counting, None).mode == "full" and counting.calls == []


def test_device_memory_budget():
    class Dev:
        def __init__(self, stats):
            self.stats = stats

        def memory_stats(self):
            return self.stats
    assert device_memory_budget(Dev(None)) is None
    assert device_memory_budget(Dev({"bytes_in_use": 5})) is None
    assert device_memory_budget(Dev({"bytes_limit": 1000, "bytes_in_use": 400})) == 900
    assert device_memory_budget(Dev({"bytes_limit": 1000}), fraction=0.5) == 500
    with pytest.raises(ValueError):
        device_memory_budget(Dev({"bytes_limit": 1000}), fraction=0.0)
    if jax.default_backend() == "cpu":
        assert device_memory_budget() is None  # XLA:CPU reports no memory stats
    else:
        assert device_memory_budget() > 0


def test_remat_setting():
    assert REMAT_CHOICES == REMAT_MODES + ("auto",)
    assert remat_setting("auto") == "auto"
    assert [remat_setting(m) for m in REMAT_MODES] == list(REMAT_MODES)
    assert remat_setting(True) == "full" and remat_setting(False) == "off"
    with pytest.raises(ValueError, match="'off', 'dots', 'full', 'auto'"):
        remat_setting("bogus")
