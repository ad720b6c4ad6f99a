"""The JAX sampler against independent references: transformers' greedy
generate, the learner's full-forward logprobs, and hand-computed filters."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import token_logprobs
from jaxrl_llm.rollout.jax_sampler import JaxSampler, filtered_logprobs, inverse_cdf_choice
from jaxrl_llm.rollout.types import SamplingParams
from tests.models.hf_reference import hf_model, our_config_and_params, torch

PROMPTS = [[5, 17, 3], [9, 2, 44, 61, 8, 30, 1], [70]]
EOS = 96  # a real vocab id of the tiny model that greedy decoding may or may not reach


@pytest.fixture(scope="module")
def tiny():
    model = hf_model("llama_tied", seed=3)
    cfg, params = our_config_and_params(model)
    return model, cfg, params


def test_greedy_matches_transformers_generate(tiny):
    model, cfg, params = tiny
    sampler = JaxSampler(cfg, params, eos_token_ids=[EOS])
    max_tokens = 12
    batch = sampler.generate(PROMPTS, n=1, params=SamplingParams(top_k=1, max_tokens=max_tokens, seed=0))
    for prompt, record in zip(PROMPTS, batch.records):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_tokens,
                                 eos_token_id=EOS, pad_token_id=0)
        expected = out[0, len(prompt):].numpy()
        np.testing.assert_array_equal(record.completion_token_ids, expected)
        assert record.finish_reason == ("stop" if expected[-1] == EOS else "length")
        # top_k=1 puts all mass on the chosen token
        np.testing.assert_allclose(record.sampler_logprobs, 0.0, atol=1e-6)


def test_temperature_zero_is_greedy_with_temperature_one_logprobs(tiny):
    """ReMax's baseline rows: temperature 0 picks transformers' greedy tokens, whatever the seed,
    and reports their logprobs under the plain softmax (the learner's at temperature 1)."""
    model, cfg, params = tiny
    sampler = JaxSampler(cfg, params, eos_token_ids=[EOS])
    runs = [sampler.generate(PROMPTS, n=2, params=SamplingParams(temperature=0.0, max_tokens=12, seed=s))
            for s in (0, 5)]
    for i, (prompt, record) in enumerate(zip([p for p in PROMPTS for _ in range(2)], runs[0].records)):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12, eos_token_id=EOS,
                                 pad_token_id=0)
        np.testing.assert_array_equal(record.completion_token_ids, out[0, len(prompt):].numpy())
        np.testing.assert_array_equal(runs[1].records[i].completion_token_ids, record.completion_token_ids)
        seq = np.concatenate([record.prompt_token_ids, record.completion_token_ids])[None]
        learner = np.asarray(token_logprobs(params, cfg, jnp.asarray(seq), temperature=1.0))[0, len(prompt) - 1:]
        np.testing.assert_allclose(record.sampler_logprobs, learner, atol=2e-5)


def test_sampled_logprobs_equal_learner_recompute(tiny):
    """The sampler's mu (KV-cache decode path) equals pi_old from one full forward,
    at the same temperature: the float32 mismatch of this engine is numerical only."""
    _, cfg, params = tiny
    sampler = JaxSampler(cfg, params, eos_token_ids=[EOS])
    temperature = 0.7
    batch = sampler.generate(PROMPTS, n=4, params=SamplingParams(temperature=temperature, max_tokens=10, seed=1))
    for record in batch.records:
        seq = np.concatenate([record.prompt_token_ids, record.completion_token_ids])[None]
        logp = token_logprobs(params, cfg, jnp.asarray(seq), temperature=temperature)
        learner = np.asarray(logp)[0, len(record.prompt_token_ids) - 1:]
        np.testing.assert_allclose(record.sampler_logprobs, learner, atol=2e-5)


def test_same_seed_same_samples_and_different_seed_differs(tiny):
    _, cfg, params = tiny
    sampler = JaxSampler(cfg, params, eos_token_ids=[EOS])
    sp = SamplingParams(temperature=1.0, max_tokens=8, seed=7)
    a = sampler.generate(PROMPTS, n=3, params=sp)
    b = sampler.generate(PROMPTS, n=3, params=sp)
    c = sampler.generate(PROMPTS, n=3, params=SamplingParams(temperature=1.0, max_tokens=8, seed=8))
    same = [np.array_equal(x.completion_token_ids, y.completion_token_ids) for x, y in zip(a, b)]
    diff = [np.array_equal(x.completion_token_ids, y.completion_token_ids) for x, y in zip(a, c)]
    assert all(same) and not all(diff)
    assert [r.prompt_index for r in a] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_a_batch_split_with_first_row_draws_the_samples_of_one_call(tiny):
    """What a multi-process RL step relies on: prompts 0..1 in one call and prompt 2 in
    another (first_row = 2 prompts x 3 samples) give the 9 samples of one call."""
    _, cfg, params = tiny
    sampler = JaxSampler(cfg, params, eos_token_ids=[EOS])
    sp = SamplingParams(temperature=1.0, max_tokens=8, seed=7)
    whole = sampler.generate(PROMPTS, n=3, params=sp)
    head = sampler.generate(PROMPTS[:2], n=3, params=sp)
    tail = sampler.generate(PROMPTS[2:], n=3, params=dataclasses.replace(sp, first_row=6))
    for expected, got in zip(whole.records, head.records + tail.records, strict=True):
        np.testing.assert_array_equal(got.completion_token_ids, expected.completion_token_ids)
        np.testing.assert_allclose(got.sampler_logprobs, expected.sampler_logprobs, atol=1e-5)
    shifted = sampler.generate(PROMPTS[2:], n=3, params=sp)  # first_row = 0: other noise, other samples
    assert not all(np.array_equal(a.completion_token_ids, b.completion_token_ids)
                   for a, b in zip(shifted.records, tail.records))


def test_first_token_frequencies_follow_softmax():
    """Empirical frequencies of the first sampled token vs softmax(logits / T) from
    a full forward: a chi-square-style bound on 4096 draws."""
    model = hf_model("llama_tied", seed=4)
    cfg, params = our_config_and_params(model)
    prompt = [5, 17, 3]
    temperature = 2.0  # flatten so several tokens have visible mass
    sampler = JaxSampler(cfg, params, eos_token_ids=[EOS])
    draws = 4096
    batch = sampler.generate([prompt], n=draws, params=SamplingParams(temperature=temperature, max_tokens=1, seed=0))
    first = np.array([r.completion_token_ids[0] for r in batch.records])
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1].double().numpy()
    probs = np.exp(logits / temperature - np.logaddexp.reduce(logits / temperature))
    counts = np.bincount(first, minlength=cfg.vocab_size)
    top = np.argsort(probs)[::-1][:5]
    for t in top:
        expected = probs[t] * draws
        assert abs(counts[t] - expected) < 5 * math.sqrt(expected) + 3, (t, counts[t], expected)


def test_filtered_logprobs_top_k_and_top_p_by_hand():
    logits = jnp.log(jnp.array([[0.1, 0.2, 0.3, 0.4]]))
    # top_k=2 keeps {0.3, 0.4} -> renormalised 3/7, 4/7
    got = np.exp(np.asarray(filtered_logprobs(logits, jnp.float32(1.0), 2, jnp.float32(1.0), False)))
    np.testing.assert_allclose(got, [[0, 0, 3 / 7, 4 / 7]], atol=1e-6)
    # top_p=0.5: 0.4 alone has mass < 0.5, so 0.3 joins (0.7 >= 0.5); 0.2 does not
    got = np.exp(np.asarray(filtered_logprobs(logits, jnp.float32(1.0), None, jnp.float32(0.5), True)))
    np.testing.assert_allclose(got, [[0, 0, 3 / 7, 4 / 7]], atol=1e-6)
    # top_p=0.35: the nucleus {0.4} already has mass >= 0.35
    got = np.exp(np.asarray(filtered_logprobs(logits, jnp.float32(1.0), None, jnp.float32(0.35), True)))
    np.testing.assert_allclose(got, [[0, 0, 0, 1]], atol=1e-6)
    # temperature 0.5 squares the probabilities before renormalising
    got = np.exp(np.asarray(filtered_logprobs(logits, jnp.float32(0.5), None, jnp.float32(1.0), False)))
    sq = np.array([0.01, 0.04, 0.09, 0.16])
    np.testing.assert_allclose(got, [sq / sq.sum()], atol=1e-6)


def test_stop_tokens_end_completions(tiny):
    _, cfg, params = tiny
    sampler = JaxSampler(cfg, params, eos_token_ids=[EOS])
    greedy = sampler.generate(PROMPTS[:1], n=1, params=SamplingParams(top_k=1, max_tokens=6, seed=0))
    tokens = greedy.records[0].completion_token_ids
    stop = int(tokens[2])  # make the third greedy token a stop token
    first_hit = int(np.argmax(tokens == stop))
    stopped = sampler.generate(PROMPTS[:1], n=1, params=SamplingParams(top_k=1, max_tokens=6, seed=0,
                                                                         stop_token_ids=(stop,)))
    rec = stopped.records[0]
    np.testing.assert_array_equal(rec.completion_token_ids, tokens[:first_hit + 1])
    assert rec.finish_reason == "stop"


def test_ignore_eos_runs_every_row_to_max_tokens(tiny):
    """ignore_eos (the fixed-length cells of bench-rollout): the EOS no longer ends a row, a
    request's own stop token still does. Reference: the greedy tokens drawn with an EOS that
    never occurs in them."""
    _, cfg, params = tiny
    free = JaxSampler(cfg, params, eos_token_ids=[EOS]).generate(
        PROMPTS[:1], n=1, params=SamplingParams(top_k=1, max_tokens=6, seed=0)).records[0].completion_token_ids
    eos = int(free[2])  # the third greedy token is this sampler's EOS
    assert eos != EOS and len(free) == 6
    sampler = JaxSampler(cfg, params, eos_token_ids=[eos])
    stopped = sampler.generate(PROMPTS[:1], n=1, params=SamplingParams(top_k=1, max_tokens=6, seed=0)).records[0]
    assert stopped.finish_reason == "stop" and len(stopped.completion_token_ids) == int(np.argmax(free == eos)) + 1
    ignored = sampler.generate(PROMPTS, n=2, params=SamplingParams(top_k=1, max_tokens=6, seed=0, ignore_eos=True))
    np.testing.assert_array_equal(ignored.records[0].completion_token_ids, free)
    assert {len(r.completion_token_ids) for r in ignored} == {6} and {r.finish_reason for r in ignored} == {"length"}
    own_stop = sampler.generate(PROMPTS[:1], n=1, params=SamplingParams(top_k=1, max_tokens=6, seed=0, ignore_eos=True,
                                                                         stop_token_ids=(eos,))).records[0]
    assert own_stop.finish_reason == "stop"
    with pytest.raises(ValueError, match="ignore_eos must be True or False, got 1"):
        SamplingParams(ignore_eos=1)


def test_update_weights_bumps_version_and_changes_samples(tiny):
    _, cfg, params = tiny
    sampler = JaxSampler(cfg, params, eos_token_ids=[EOS])
    sp = SamplingParams(top_k=1, max_tokens=6, seed=0)
    before = sampler.generate(PROMPTS, n=1, params=sp)
    assert {r.weight_version for r in before} == {0}
    perturbed = jax.tree.map(lambda x: x * 1.5, params)
    assert sampler.update_weights(perturbed) == 1
    after = sampler.generate(PROMPTS, n=1, params=sp)
    assert {r.weight_version for r in after} == {1}
    assert any(not np.array_equal(x.completion_token_ids, y.completion_token_ids) for x, y in zip(before, after))


def test_bad_input_is_named(tiny):
    _, cfg, params = tiny
    sampler = JaxSampler(cfg, params, eos_token_ids=[EOS])
    with pytest.raises(ValueError, match="n .*>= 1"):
        sampler.generate(PROMPTS, n=0, params=SamplingParams())
    with pytest.raises(ValueError, match="max_position_embeddings"):
        sampler.generate(PROMPTS, n=1, params=SamplingParams(max_tokens=10**6))
    with pytest.raises(ValueError, match="eos_token_ids"):
        JaxSampler(cfg, params, eos_token_ids=[])


def test_inverse_cdf_choice_equals_float64_inversion_and_skips_zero_mass():
    """The per-row draw against an independent float64 inversion (searchsorted on the
    cumulative sum): same token for all but boundary-rounding cases; tokens filtered
    to probability 0 never come out, also for uniforms at the ends of [0, 1)."""
    rng = np.random.default_rng(0)
    vocab = 1000  # not a multiple of the block: the padded tail has zero mass
    logits = jnp.asarray(rng.normal(size=(1, vocab)) * 2, jnp.float32)
    logp = filtered_logprobs(logits, jnp.float32(1.0), None, jnp.float32(0.9), True)  # nucleus: zeros inside
    probs = np.exp(np.asarray(logp, np.float64))[0]
    assert (probs == 0).sum() > 100
    draws = 20000
    uniform = np.concatenate([rng.random(draws - 3), [0.0, np.float32(1 - 2**-24), 0.5]]).astype(np.float32)
    choose = jax.jit(lambda lp, u: inverse_cdf_choice(jnp.broadcast_to(lp, (u.shape[0], vocab)), u, block=64))
    got = np.asarray(choose(logp, jnp.asarray(uniform)))
    cdf = np.cumsum(probs)
    expected = np.searchsorted(cdf, uniform.astype(np.float64) * cdf[-1], side="right")
    assert (got != expected).sum() <= 5, (got != expected).sum()
    assert probs[got].min() > 0
    counts = np.bincount(got, minlength=vocab) / draws
    assert 0.5 * np.abs(counts - probs).sum() < 0.04  # total variation of 20000 draws over ~90 tokens


def test_inverse_cdf_choice_with_one_token_of_mass():
    logp = jnp.full((4, 300), -jnp.inf).at[:, 257].set(0.0)  # top_k=1 style: all mass in the second block
    # 1.0 stands for a target rounded up to the total mass: the last token of mass > 0 is taken
    got = inverse_cdf_choice(logp, jnp.asarray([0.0, 0.5, np.float32(1 - 2**-24), 1.0]))
    np.testing.assert_array_equal(np.asarray(got), [257, 257, 257, 257])


def test_dropping_finished_rows_changes_no_sample(tiny):
    """The decode loop with finished rows compacted away down to one row (8 -> 6 -> 4 -> 3 -> 2 -> 1, as
    the sampler runs long generations, cache read in windows) against the loop computing every
    row to the end over the whole cache: same tokens, logprobs, lengths and stop flags."""
    from jaxrl_llm.rollout.jax_sampler import _generate, compaction_sizes

    _, cfg, params = tiny
    assert compaction_sizes(32) == (32, 24, 18, 12, 9)  # short generations: not below 8 rows
    assert compaction_sizes(32, smallest=1) == (32, 24, 18, 12, 9, 6, 4, 3, 2, 1)
    # at most 12 steps: x3/4 while divisible by 4, else x2/3, else x1/2
    assert compaction_sizes(256, smallest=1) == (256, 192, 144, 108, 81, 54, 36, 27, 18, 12, 9, 6, 4)
    assert compaction_sizes(24, smallest=1, compactions=2) == (24, 18, 12)
    assert compaction_sizes(10, smallest=1) == (10, 5)  # 5: no whole step left
    rng = np.random.default_rng(0)
    prompts = jnp.asarray(rng.integers(1, cfg.vocab_size, (8, 5)), jnp.int32)
    stop = jnp.arange(0, cfg.vocab_size, 4, dtype=jnp.int32)  # a quarter of the vocab stops: lengths spread
    args = (params, cfg, prompts, jnp.ones((8, 5), bool), jax.random.key(3), jnp.float32(1.0), jnp.float32(1.0),
            stop)
    full = _generate(*args, max_tokens=12, top_k=None, use_top_p=False, compact=False)
    compacted = _generate(*args, max_tokens=12, top_k=None, use_top_p=False, compact=True, min_rows=1,
                          cache_window=8)
    lengths = np.sort(np.asarray(full[2]))
    # every stage is entered (the 2-row one exits at once here) and the 1-row stage runs steps alone
    assert lengths[-5] < lengths[-2] < lengths[-1], lengths
    for a, b in zip(full, compacted):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_reading_the_cache_in_windows_changes_no_sample(tiny):
    """Decode steps that attend over the filled 32-slot windows of the KV cache only, against
    steps reading all 105 slots: bit-identical tokens and logprobs over 100 steps (4 window
    sizes: 32, 64, 96, 105). Exact because the masked slots add exact zeros and XLA:CPU picks the
    same dot kernels at these shapes (at some small shapes it does not, then equal up to rounding)."""
    from jaxrl_llm.models.decoder import cache_window_sizes
    from jaxrl_llm.rollout.jax_sampler import _generate

    _, cfg, params = tiny
    assert cache_window_sizes(105, 32) == (32, 64, 96, 105)
    assert cache_window_sizes(64, 32) == (32, 64)
    rng = np.random.default_rng(1)
    prompts = jnp.asarray(rng.integers(1, cfg.vocab_size, (32, 5)), jnp.int32)
    args = (params, cfg, prompts, jnp.ones((32, 5), bool), jax.random.key(5), jnp.float32(1.0), jnp.float32(1.0),
            jnp.asarray([-1], jnp.int32))  # no stop: every row runs through all windows
    kwargs = dict(max_tokens=100, top_k=None, use_top_p=False, compact=False)
    whole = jax.device_get(_generate(*args, **kwargs))
    windowed = jax.device_get(_generate(*args, **kwargs, cache_window=32))
    assert (whole[2] == 100).all()
    for a, b in zip(whole, windowed):
        np.testing.assert_array_equal(a, b)


def test_one_prefill_per_prompt_changes_no_sample(tiny):
    """generate(n=3) prefills each distinct prompt once and copies its cache to its 3 rows
    (filler rows start finished); against the decode program fed every row's prompt
    separately, each row prefilled on its own (the layout before this change): same
    tokens, logprobs, lengths and stop flags, row by row."""
    from jaxrl_llm.rollout.jax_sampler import _generate

    _, cfg, params = tiny
    n, sampling = 3, SamplingParams(temperature=1.0, max_tokens=10, seed=11)
    batch = JaxSampler(cfg, params, eos_token_ids=[EOS]).generate(PROMPTS, n, sampling)
    rows = [p for p in PROMPTS for _ in range(n)]
    tokens, mask = np.zeros((16, 16), np.int32), np.zeros((16, 16), bool)  # 9 rows -> 16, as the sampler pads
    for i, p in enumerate(rows):
        tokens[i, 16 - len(p):], mask[i, 16 - len(p):] = p, True
    mask[len(rows):, -1] = True
    out = jax.device_get(_generate(params, cfg, jnp.asarray(tokens), jnp.asarray(mask), jax.random.key(11),
                                   jnp.float32(1.0), jnp.float32(1.0), jnp.asarray([EOS], jnp.int32),
                                   max_tokens=10, top_k=None, use_top_p=False))
    out_tokens, out_logprobs, lengths, stopped = out
    assert len(set(map(len, (r.completion_token_ids for r in batch.records)))) > 1  # lengths differ: stops happen
    for i, record in enumerate(batch.records):
        assert len(record.completion_token_ids) == lengths[i]
        np.testing.assert_array_equal(record.completion_token_ids, out_tokens[i, :lengths[i]])
        np.testing.assert_allclose(record.sampler_logprobs, out_logprobs[i, :lengths[i]], atol=1e-5)
        assert (record.finish_reason == "stop") == stopped[i]
