"""The JAX sampler's routed experts (RolloutRecord.routed_experts) against an independent formulation:
ONE cache-free, unpadded forward over each sample's prompt + completion with return_routing=True.
The sampler's rows come from a padded prefill, per-step decodes over a KV cache, finished rows compacted
away or slots refilled, and a prompt's prefill shared by its n samples; the reference has none of that."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import DecoderConfig, forward, init_params
from jaxrl_llm.rollout.jax_sampler import JaxSampler
from jaxrl_llm.rollout.sampler_routing import experts_dtype, sample_routed_experts
from jaxrl_llm.rollout.types import SamplingParams

PROMPTS = [[5, 17, 3], [9, 2, 44, 61, 8, 30, 1, 12, 40, 7, 22], [50]]  # 3, 11 and 1 tokens
STOPS = (3, 7, 11, 19, 23, 29)  # ends most samples early (each step stops with probability ~6/64)
MAX_TOKENS = 12


def tiny_moe_config(**changes) -> DecoderConfig:
    fields = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                  head_dim=8, family="qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                  norm_topk_prob=True, max_position_embeddings=128)
    return DecoderConfig(**(fields | changes))


def tiny_moe_params(cfg: DecoderConfig, seed: int = 0):
    """Random params with a router 50x the default scale: decisive top-k (no near-ties for rounding to flip)."""
    params = init_params(cfg, jax.random.PRNGKey(seed))
    layers = dict(params["layers"], router=params["layers"]["router"] * 50.0)
    return dict(params, layers=layers)


@pytest.fixture(scope="module")
def moe():
    cfg = tiny_moe_config()
    return cfg, tiny_moe_params(cfg)


@functools.partial(jax.jit, static_argnums=1)
def _full_forward_experts(params, cfg, tokens):
    return forward(params, cfg, tokens, return_routing=True).routing.experts


def reference_experts(params, cfg, record) -> np.ndarray:
    """Experts [P + L - 1, nL, k] of one full forward (no cache, no padding) over the sample's tokens."""
    tokens = np.concatenate([record.prompt_token_ids, record.completion_token_ids])[None]
    return np.asarray(_full_forward_experts(params, cfg, jnp.asarray(tokens))[0, :-1])


def assert_records_match_reference(params, cfg, batch):
    stopped_early = 0
    for record in batch.records:
        rows = len(record.prompt_token_ids) + len(record.completion_token_ids) - 1
        assert record.routed_experts.shape == (rows, cfg.num_layers, cfg.num_experts_per_tok)
        assert record.routed_experts.dtype == np.int32
        expected = reference_experts(params, cfg, record)
        np.testing.assert_array_equal(np.sort(record.routed_experts, -1), np.sort(expected, -1),
                                      err_msg=f"prompt {record.prompt_index} sample {record.sample_index}")
        stopped_early += record.finish_reason == "stop" and len(record.completion_token_ids) < MAX_TOKENS
    assert stopped_early > 0 and any(r.finish_reason == "length" for r in batch.records)


@pytest.mark.parametrize("decode,options", [
    # finished rows compacted away mid-decode (16, 12, 9, 6 rows: the unfinished ones move to the front)
    pytest.param("compact", dict(long_generation=1, compactions=3, cache_window=None),
                 marks=pytest.mark.slow),  # ~45 s on 2 cores; `make test` keeps the slots case (~8 s)
    ("slots", dict(decode_slots=4)),  # 12 samples through 4 slots: refills
])
def test_routed_experts_equal_one_full_forward(moe, decode, options):
    cfg, params = moe
    sampler = JaxSampler(cfg, params, eos_token_ids=[63], decode=decode, return_routed_experts=True, **options)
    batch = sampler.generate(PROMPTS, n=4, params=SamplingParams(max_tokens=MAX_TOKENS, seed=4,
                                                                 stop_token_ids=STOPS))
    assert_records_match_reference(params, cfg, batch)
    assert sum(r.finish_reason == "stop" for r in batch.records) > 6  # some finish while 6 or fewer run on
    # the n samples of a prompt share its prefill: the prompt rows are the same, the completions differ
    first, second = batch.records[4], batch.records[5]
    np.testing.assert_array_equal(first.routed_experts[:11], second.routed_experts[:11])
    assert not np.array_equal(first.completion_token_ids, second.completion_token_ids)


def test_routed_experts_are_off_by_default_and_refused_for_dense_models(moe):
    cfg, params = moe
    batch = JaxSampler(cfg, params, eos_token_ids=[63]).generate(PROMPTS, 1, SamplingParams(max_tokens=3, seed=0))
    assert all(r.routed_experts is None for r in batch.records)
    dense = DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                          num_kv_heads=2, head_dim=8, family="qwen3")
    with pytest.raises(ValueError, match="Qwen3ForCausalLM is dense"):
        JaxSampler(dense, None, eos_token_ids=[63], return_routed_experts=True)


def test_sample_rows_and_dtype_by_hand():
    prompt = np.arange(6).reshape(3, 1, 2)
    completion = 10 + np.arange(8).reshape(4, 1, 2)
    rows = sample_routed_experts(prompt, completion, length=3)  # 3 prompt rows + completion tokens 0, 1
    assert rows.dtype == np.int32
    np.testing.assert_array_equal(rows[:, 0], [[0, 1], [2, 3], [4, 5], [10, 11], [12, 13]])
    assert experts_dtype(128) == jnp.uint8 and experts_dtype(257) == jnp.int16 and experts_dtype(40000) == jnp.int32


@pytest.mark.parametrize("decode", ["compact", "slots"])
def test_batch_invariant_routed_experts_are_the_learners_exactly(moe, decode):
    """rollout.batch_invariant: the recorded experts, in the router's order, are bitwise those of the
    learner's forward(batch_invariant=True) over all samples in one right-padded batch."""
    cfg, params = moe
    sampler = JaxSampler(cfg, params, eos_token_ids=[63], decode=decode, batch_invariant=True,
                         return_routed_experts=True, decode_slots=4)
    batch = sampler.generate(PROMPTS, n=2, params=SamplingParams(max_tokens=MAX_TOKENS, seed=1,
                                                                 stop_token_ids=STOPS))
    sequences = [np.concatenate([r.prompt_token_ids, r.completion_token_ids]) for r in batch.records]
    tokens = np.zeros((len(sequences), max(map(len, sequences))), np.int32)
    mask = np.zeros(tokens.shape, np.int32)
    for row, seq in enumerate(sequences):
        tokens[row, :len(seq)], mask[row, :len(seq)] = seq, 1
    learner = forward(params, cfg, jnp.asarray(tokens), attention_mask=jnp.asarray(mask), batch_invariant=True,
                      return_routing=True)
    experts = np.asarray(learner.routing.experts)
    for row, record in enumerate(batch.records):
        np.testing.assert_array_equal(record.routed_experts, experts[row, :len(sequences[row]) - 1])


def test_batch_invariant_forward_replays_its_own_routing_bitwise(moe):
    """The invariant block takes replay too (models.batch_invariant.block): replaying a record under
    forward(batch_invariant=True) gives the same log-probs bit for bit; other experts change them."""
    cfg, params = moe
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, 64, size=(3, 9)))
    step = jax.jit(lambda p, t, r: forward(p, cfg, t, batch_invariant=True, routing=r, return_routing=True))
    recorded = step(params, tokens, None)
    replayed = step(params, tokens, recorded.routing.experts)
    np.testing.assert_array_equal(np.asarray(replayed.out), np.asarray(recorded.out))
    other = (recorded.routing.experts + 1) % cfg.num_experts
    assert not np.array_equal(np.asarray(step(params, tokens, other).out), np.asarray(recorded.out))
