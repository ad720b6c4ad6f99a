"""The slot decode (`rollout.decode_slots`, JaxSampler(decode="slots")) against today's compacting
decode (decode="compact"): same seed, float32, CPU -> the same tokens and log-probs, for batches
stopped by stop tokens, fixed-length batches and batches refilled from a queue longer than the
slots; and a row's samples independent of its batch-mates and of the slot count. Its attention
kernels against a numpy softmax."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models.decode_attention import pallas_blocks, prefix_attention, resolve_decode_kernel
from jaxrl_llm.rollout.jax_sampler import JaxSampler, decode_path
from jaxrl_llm.rollout.sampling import row_uniforms
from jaxrl_llm.rollout.types import SamplingParams
from tests.models.hf_reference import hf_model, our_config_and_params

PROMPTS = [[5, 17, 3], [9, 2, 44, 61, 8, 30, 1], [70], [11, 12, 13, 14]]
EOS = 96
# 14 of the tiny model's 97 ids stop a row: at temperature 1 its near-uniform rows stop after ~7 tokens
STOPS = list(range(0, 97, 7))


@pytest.fixture(scope="module")
def tiny():
    cfg, params = our_config_and_params(hf_model("llama_tied", seed=3))
    return cfg, params


def run(cfg, params, prompts, n, sampling, **options):
    return JaxSampler(cfg, params, eos_token_ids=[EOS], **options).generate(prompts, n=n, params=sampling)


def assert_same_samples(expected, got, atol=1e-6):
    assert len(expected.records) == len(got.records)
    for i, (a, b) in enumerate(zip(expected.records, got.records)):
        np.testing.assert_array_equal(b.completion_token_ids, a.completion_token_ids, err_msg=f"row {i}")
        np.testing.assert_allclose(b.sampler_logprobs, a.sampler_logprobs, rtol=1e-6, atol=atol, err_msg=f"row {i}")
        assert b.finish_reason == a.finish_reason, f"row {i}"


def lengths(batch):
    return [r.num_completion_tokens for r in batch.records]


def test_stop_token_batch_matches_compacting_decode(tiny):
    cfg, params = tiny
    sampling = SamplingParams(max_tokens=12, seed=7, stop_token_ids=STOPS)
    compact = run(cfg, params, PROMPTS, 2, sampling, decode="compact")
    slots = run(cfg, params, PROMPTS, 2, sampling, decode="slots")  # one slot per row: no refill
    reasons = {r.finish_reason for r in compact.records}
    assert reasons == {"stop", "length"}, reasons  # the batch is stopped by stop tokens, not all at max_tokens
    assert_same_samples(compact, slots)


def test_fixed_length_batch_matches_compacting_decode(tiny):
    cfg, params = tiny
    sampling = SamplingParams(max_tokens=10, seed=3, ignore_eos=True, temperature=0.8, top_p=0.9)
    compact = run(cfg, params, PROMPTS, 2, sampling, decode="compact")
    slots = run(cfg, params, PROMPTS, 2, sampling, decode="slots")
    assert lengths(compact) == [10] * 8
    assert_same_samples(compact, slots)


def test_refilled_slots_match_compacting_decode_on_all_rows(tiny):
    """12 samples in 4 slots: 8 samples wait for a slot to free, and lengths differ."""
    cfg, params = tiny
    sampling = SamplingParams(max_tokens=12, seed=11, stop_token_ids=STOPS)
    compact = run(cfg, params, PROMPTS, 3, sampling, decode="compact")
    slots = run(cfg, params, PROMPTS, 3, sampling, decode="slots", decode_slots=4)
    assert len(set(lengths(compact))) >= 4, lengths(compact)
    assert_same_samples(compact, slots)


def test_row_samples_do_not_depend_on_batch_mates_or_slots(tiny):
    """Prompt X's two samples are output rows 4 and 5 (X third of three prompts, n = 2). With one slot
    per row they sit in slots 4, 5; with 2 or 3 slots they wait for whichever slot frees first, which
    depends on how long the other prompts' samples run. Their tokens and log-probs stay the same."""
    cfg, params = tiny
    sampling = SamplingParams(max_tokens=12, seed=5, stop_token_ids=STOPS)
    x = [23, 4, 58]
    alone = run(cfg, params, [PROMPTS[0], PROMPTS[1], x], 2, sampling, decode="slots", decode_slots=6)
    others = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], [40, 41]]
    for prompts, slots in (([PROMPTS[0], PROMPTS[1], x], 2), (others + [x], 3), (others + [x, PROMPTS[3]], 2)):
        mixed = run(cfg, params, prompts, 2, sampling, decode="slots", decode_slots=slots)
        for row in (4, 5):
            np.testing.assert_array_equal(mixed.records[row].completion_token_ids,
                                          alone.records[row].completion_token_ids)
            np.testing.assert_allclose(mixed.records[row].sampler_logprobs, alone.records[row].sampler_logprobs,
                                       rtol=1e-6, atol=1e-6)


def test_batch_invariant_slot_decode_is_bitwise_the_compacting_one(tiny):
    cfg, params = tiny
    sampling = SamplingParams(max_tokens=10, seed=2, stop_token_ids=STOPS)
    compact = run(cfg, params, PROMPTS, 2, sampling, decode="compact", batch_invariant=True)
    slots = run(cfg, params, PROMPTS, 2, sampling, decode="slots", decode_slots=3, batch_invariant=True)
    for a, b in zip(compact.records, slots.records):
        np.testing.assert_array_equal(b.completion_token_ids, a.completion_token_ids)
        np.testing.assert_array_equal(b.sampler_logprobs, a.sampler_logprobs)


def test_row_uniforms_are_the_rows_elements_of_one_draw():
    key = jax.random.key(4)
    steps, rows = jnp.array([0, 3, 3, 1], jnp.int32), jnp.array([2, 0, 5, 2], jnp.int32)
    got = np.asarray(row_uniforms(key, steps, rows, size=9, first_row=3))
    expected = [float(jax.random.uniform(jax.random.fold_in(key, int(t)), (9,))[3 + int(r)])
                for t, r in zip(steps, rows)]
    np.testing.assert_array_equal(got, np.asarray(expected, np.float32))


def numpy_prefix_attention(q, k, v, lengths):
    """Per row b and query head h: softmax over keys [0, lengths[b]) of the head's KV group, in float64."""
    batch, _, heads, dim = q.shape
    group = heads // k.shape[2]
    out = np.zeros(q.shape)
    for b in range(batch):
        for h in range(heads):
            keys, values = k[b, :lengths[b], h // group].astype(np.float64), v[b, :lengths[b], h // group]
            scores = keys @ q[b, 0, h].astype(np.float64) / math.sqrt(dim)
            weights = np.exp(scores - scores.max())
            out[b, 0, h] = weights / weights.sum() @ values
    return out


@pytest.mark.parametrize("kernel", ["dense", "pallas"])
def test_prefix_attention_matches_numpy(kernel):
    """pallas runs in Pallas' interpreter on CPU: its numbers, not its speed."""
    rng = np.random.default_rng(0)
    q = rng.normal(size=(3, 1, 4, 16)).astype(np.float32)
    k, v = (rng.normal(size=(3, 64, 2, 16)).astype(np.float32) for _ in range(2))
    row_lengths = np.array([1, 64, 19], np.int32)
    got = np.asarray(prefix_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(row_lengths),
                                      kernel))
    np.testing.assert_allclose(got, numpy_prefix_attention(q, k, v, row_lengths), rtol=1e-5, atol=1e-5)


def test_pallas_blocks_split_the_cache_into_whole_blocks():
    """(k_splits, block_k): the kernel asserts length % splits == 0, length / splits >= 16 and a whole number
    of blocks per split."""
    assert pallas_blocks(2048) == (16, 128) and pallas_blocks(64) == (4, 16) and pallas_blocks(48) == (1, 16)
    with pytest.raises(ValueError, match="multiple of 16, got 24"):
        pallas_blocks(24)


def test_pallas_kernel_draws_the_dense_kernels_samples(tiny):
    cfg, params = tiny
    sampling = SamplingParams(max_tokens=6, seed=7, stop_token_ids=STOPS)
    dense = run(cfg, params, PROMPTS, 2, sampling, decode="slots", decode_slots=4, decode_kernel="dense")
    pallas = run(cfg, params, PROMPTS, 2, sampling, decode="slots", decode_slots=4, decode_kernel="pallas")
    assert_same_samples(dense, pallas)


def test_decode_choice_by_backend_and_bad_names(tiny):
    assert decode_path("auto", "cpu") == "compact"
    assert decode_path("auto", "gpu") == decode_path("auto", "tpu") == "slots"
    assert decode_path("compact", "gpu") == "compact"
    assert resolve_decode_kernel("auto", "gpu") == "dense"  # no fused kernel is picked before a GPU has run it
    cfg, params = tiny
    with pytest.raises(ValueError, match="'slot'.*compact"):
        JaxSampler(cfg, params, eos_token_ids=[EOS], decode="slot")
    with pytest.raises(ValueError, match="'flash'.*pallas"):
        JaxSampler(cfg, params, eos_token_ids=[EOS], decode_kernel="flash")
    with pytest.raises(ValueError, match="decode_slots.*0"):
        JaxSampler(cfg, params, eos_token_ids=[EOS], decode_slots=0)


def test_smollm2_slot_decode_matches_compacting_decode(smollm2):
    """Real weights (SmolLM2-135M, float32): 3 prompts x 2 samples x 16 tokens, 4 slots (refill).
    Same tokens; log-probs to 5e-5: 30 layers of float32 summed in another order (right- instead of
    left-padded prompts, other batch sizes) move them by up to ~2e-5 (measured), the size of the
    compacting sampler's own gap to the learner's recompute (test_jax_sampler: 2e-5). top_k = 40: over the
    full 49k vocabulary that rounding can move the cumulative mass across a row's uniform where the
    tokens are tiny (seen: seed 1, row 5, token 2, two tail tokens of log-prob -14.6 and -11.1, with and
    without refill), so exact token equality on real weights is asked where the tail is cut."""
    prompts = [[1, 504, 3458, 314], [1, 30, 2, 5], [1, 9, 8, 7, 6, 5, 4, 3, 2, 10, 11]]
    sampling = SamplingParams(max_tokens=16, seed=1, top_k=40, stop_token_ids=[13, 28, 30])
    options = dict(eos_token_ids=[smollm2.cfg.vocab_size])
    compact = JaxSampler(smollm2.cfg, smollm2.params, decode="compact", **options).generate(prompts, 2, sampling)
    slots = JaxSampler(smollm2.cfg, smollm2.params, decode="slots", decode_slots=4, **options).generate(
        prompts, 2, sampling)
    assert_same_samples(compact, slots, atol=5e-5)


def test_config_names_the_bad_decode_field():
    from jaxrl_llm.train.config import RolloutConfig
    from jaxrl_llm.utils.typed_config import ConfigError, from_dict

    with pytest.raises(ConfigError, match=r"rollout.decode = 'slot'.*'compact'"):
        from_dict(RolloutConfig, {"decode": "slot"})
    with pytest.raises(ConfigError, match=r"rollout.decode_kernel = 'flash'.*'pallas'"):
        from_dict(RolloutConfig, {"decode_kernel": "flash"})
    assert from_dict(RolloutConfig, {"decode": "slots", "decode_slots": 64}).decode_slots == 64
