"""The JAX sampler on a mesh of its own (`rollout.sampler_mesh`, `rollout.mesh`), on 8 fake CPU devices:
the same tokens and log-probs as on one device (float32, greedy and seeded), the hand-off from the
learner's FSDP layout bitwise with the shardings written out by hand, the GQA plan by hand, and
the config's refusals."""
import math

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxrl_llm.models import init_params, make_mesh, param_shardings
from jaxrl_llm.models.config import tiny_decoder_config
from jaxrl_llm.rollout.jax_sampler import JaxSampler
from jaxrl_llm.rollout.sampler_mesh import SamplerLayout, sampler_mesh
from jaxrl_llm.rollout.types import SamplingParams
from jaxrl_llm.train.config import Config, ConfigError, apply_overrides
from jaxrl_llm.train.distributed import rollout_mesh

PROMPTS = [[5, 17, 3], [9, 2, 44, 61, 8, 30, 1], [70], [11, 12, 13, 14]]
EOS = 1
# Qwen2 (q/k/v biases), tied embeddings, GQA with 4 q heads over 2 KV heads; vocabulary, widths and heads
# divide 4, so on tensor=4 every rule splits its dimension and each KV head is stored twice.
CFG = tiny_decoder_config(family="qwen2", qkv_bias=True, vocab_size=128, hidden_size=64, intermediate_size=128,
                          num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=128)


def peaked_params():
    """Random params scaled up so each step's distribution is far from uniform (no near-ties to flip)."""
    params = init_params(CFG, jax.random.PRNGKey(0))
    return jax.tree.map(lambda x: x * 8.0 if x.ndim >= 2 else x + 0.1, params)


@pytest.fixture(scope="module")
def params():
    return peaked_params()


@pytest.fixture(scope="module")
def learner_params(params):
    """The params as the learner hands them over: FSDP-sharded over all 8 devices (`models.sharding`)."""
    assert jax.device_count() == 8, "tests/conftest.py sets up 8 fake CPU devices"
    return jax.device_put(params, param_shardings(params, make_mesh(fsdp=8)))


SAMPLING = {"greedy": SamplingParams(temperature=0.0, max_tokens=12, seed=3),
            "seeded": SamplingParams(temperature=1.0, max_tokens=12, seed=3)}


def samples(sampler):
    return {name: sampler.generate(PROMPTS, n=2, params=sp) for name, sp in SAMPLING.items()}


@pytest.fixture(scope="module")
def one_device(params):
    one = jax.device_put(params, jax.devices()[0])
    return {decode: samples(JaxSampler(CFG, one, eos_token_ids=[EOS], decode=decode))
            for decode in ("compact", "slots")}


@pytest.mark.parametrize("decode, data, tensor", [("compact", 2, 4), ("compact", 1, 8), ("slots", 2, 4), ("slots", 1, 8)],
                         ids=["compact-data2-tensor4", "compact-tensor8-heads-whole", "slots-data2-tensor4-slots-split",
                              "slots-tensor8-slots-split"])
def test_mesh_decode_draws_the_one_device_samples(one_device, learner_params, decode, data, tensor):
    """Compact, tensor 4 > 2 KV heads: each KV head stored twice, heads split; tensor 8 does not split 4 q
    heads: attention whole on every device, MLP and vocabulary split. Slots: the cache split by slots over
    "tensor", each KV head stored once, attention weights split by columns. Each way the one-device
    tokens, and log-probs up to the rounding of the tensor-parallel sums."""
    sampler = JaxSampler(CFG, learner_params, eos_token_ids=[EOS], decode=decode, mesh=sampler_mesh(data, tensor))
    columns = "tensor" if tensor == 4 or decode == "slots" else None
    assert sampler.params["layers"]["k_proj"].sharding.spec == P(None, None, columns)
    assert sampler.params["layers"]["down_proj"].sharding.spec == P(None, "tensor", None)
    kv_heads, slots_split = (2, True) if decode == "slots" else (4 if tensor == 4 else 2, False)
    assert sampler._model.num_kv_heads == kv_heads and sampler.layout.split_slots == slots_split
    cache = sampler.layout.cache_sharding((2, 8, 32, kv_heads, 16)).spec  # [nL, rows, slots, Hkv, hd]
    assert cache == (P(None, "data", "tensor", None, None) if slots_split
                     else P(None, "data", None, "tensor" if tensor == 4 else None, None))
    got = samples(sampler)
    for name, expected in one_device[decode].items():
        assert sum(r.num_completion_tokens for r in expected.records) >= 40, "too few tokens to compare"
        for i, (a, b) in enumerate(zip(expected.records, got[name].records)):
            np.testing.assert_array_equal(b.completion_token_ids, a.completion_token_ids, err_msg=f"{name} row {i}")
            np.testing.assert_allclose(b.sampler_logprobs, a.sampler_logprobs, rtol=1e-5, atol=1e-5,
                                       err_msg=f"{name} row {i}")
            assert b.finish_reason == a.finish_reason


# The sampler's layout of CFG on data=2 x tensor=4, written out (module doc of rollout.sampler_mesh).
EXPECTED_SPECS = {
    "embed": P("tensor", None), "final_norm": P(None),
    "layers": {"input_norm": P(None, None), "post_norm": P(None, None),
               "q_proj": P(None, None, "tensor"), "k_proj": P(None, None, "tensor"), "v_proj": P(None, None, "tensor"),
               "q_bias": P(None, "tensor"), "k_bias": P(None, "tensor"), "v_bias": P(None, "tensor"),
               "o_proj": P(None, "tensor", None), "gate_proj": P(None, None, "tensor"),
               "up_proj": P(None, None, "tensor"), "down_proj": P(None, "tensor", None)}}


def kv_heads_twice(w: np.ndarray) -> np.ndarray:
    """[..., 2 heads x 16] -> [..., 4 heads x 16] as heads h0 h0 h1 h1, by numpy slicing."""
    h0, h1 = w[..., :16], w[..., 16:]
    return np.concatenate([h0, h0, h1, h1], axis=-1)


def test_hand_off_is_bitwise_with_the_layouts_shardings(params, learner_params):
    mesh = sampler_mesh(2, 4)
    layout = SamplerLayout.plan(CFG, mesh)
    placed = layout.placer(CFG, learner_params)(learner_params)
    expected = jax.tree.map(np.asarray, params)
    for name in ("k_proj", "v_proj", "k_bias", "v_bias"):
        expected["layers"][name] = kv_heads_twice(expected["layers"][name])
    flat_expected = jax.tree_util.tree_flatten_with_path(expected)[0]
    flat_placed = jax.tree.leaves(placed)
    flat_specs = jax.tree.leaves(EXPECTED_SPECS, is_leaf=lambda x: isinstance(x, P))
    assert len(flat_expected) == len(flat_placed) == len(flat_specs) == 14
    for (path, want), got, spec in zip(flat_expected, flat_placed, flat_specs):
        where = jax.tree_util.keystr(path)
        assert got.shape == want.shape and got.dtype == want.dtype, where
        np.testing.assert_array_equal(np.asarray(got).view(np.uint32), want.view(np.uint32), err_msg=where)
        assert got.sharding.mesh == mesh and got.sharding.spec == spec, (where, got.sharding.spec)
    shard = placed["layers"]["k_proj"].addressable_shards[0].data  # 2 layers x D 64 x one of 4 heads
    assert shard.shape == (2, 64, 16)


def test_weights_are_placed_once_per_version(learner_params):
    """The hand-off runs in update_weights (once per version), never in generate."""
    sampler = JaxSampler(CFG, learner_params, eos_token_ids=[EOS], decode="slots", mesh=sampler_mesh(2, 4))
    calls = []
    place = sampler._place
    sampler._place = lambda p: calls.append(1) or place(p)
    placed = sampler.params
    for _ in range(2):
        sampler.generate(PROMPTS, n=1, params=SAMPLING["seeded"])
    assert calls == [] and sampler.params is placed
    assert sampler.update_weights(learner_params) == 1 and calls == [1]
    assert sampler.params["embed"].sharding.spec == P("tensor", None)


@pytest.mark.parametrize("heads, kv_heads, tensor, repeat, split", [
    (4, 2, 4, 2, True),     # tensor > KV heads: each stored twice
    (12, 2, 4, 2, True),    # Qwen2.5-1.5B on tensor 4
    (12, 2, 8, 1, False),   # 8 does not divide 12 q heads: attention whole
    (32, 8, 4, 1, True),    # tensor divides the KV heads: no copies
    (28, 4, 8, 1, False),   # Qwen2.5-7B on tensor 8: lcm(4, 8) = 8 does not divide 28
    (40, 8, 16, 1, False),  # lcm(8, 16) = 16 does not divide 40: attention whole
    (64, 4, 16, 4, True),   # Qwen3-30B-A3B-like: 4 KV heads, 16-way tensor
])
@pytest.mark.parametrize("decode", ["compact", "slots"])
def test_gqa_plan_by_hand(heads, kv_heads, tensor, repeat, split, decode):
    """The slot decode splits the cache by slots wherever the heads plan would copy KV heads or keep
    attention whole (tensor does not divide the KV heads); the compacting decode keeps the heads plan."""
    cfg = tiny_decoder_config(num_heads=heads, num_kv_heads=kv_heads)
    mesh = jax.sharding.AbstractMesh((8 // tensor if tensor <= 8 else 1, tensor), ("data", "tensor"))
    layout = SamplerLayout.plan(cfg, mesh, decode)
    if decode == "slots" and kv_heads % tensor:
        assert (layout.kv_repeat, layout.split_heads, layout.split_slots) == (1, False, True)
        assert layout.model_config(cfg).num_kv_heads == kv_heads
        return
    assert (layout.kv_repeat, layout.split_heads, layout.split_slots) == (repeat, split, False)
    assert layout.model_config(cfg).num_kv_heads == kv_heads * repeat
    if split:
        assert heads % (kv_heads * repeat) == 0 and (kv_heads * repeat) % tensor == 0
        assert kv_heads * repeat == math.lcm(kv_heads, tensor)


@pytest.mark.parametrize("data, tensor, names", [
    (3, -1, ["data=3 x tensor=-1", "does not divide the 8 devices", "valid: a divisor of 8"]),
    (2, 2, ["data=2 x tensor=2 = 4 devices", "this process has 8", "valid:"]),
    (0, 8, ["data=0", "valid: positive ints"]),
    (-1, -1, ["data=-1, tensor=-1", "-1 on one axis"]),
])
def test_bad_mesh_sizes_are_named(data, tensor, names):
    with pytest.raises(ValueError) as err:
        sampler_mesh(data, tensor)
    for name in names:
        assert name in str(err.value), str(err.value)


def test_config_section_and_its_refusals():
    cfg = apply_overrides(Config(), ["rollout.engine=jax", "rollout.mesh.tensor=4"])
    assert cfg.rollout.mesh.sizes() == (-1, 4)
    mesh = rollout_mesh(cfg.rollout.mesh)
    assert dict(mesh.shape) == {"data": 2, "tensor": 4}
    assert rollout_mesh(Config().rollout.mesh) is None  # unset: today's behaviour
    bad = {"rollout.mesh.tensor=3": "rollout.mesh: sampler mesh data=-1 x tensor=3",
           "rollout.mesh.data=0": "rollout.mesh.data = 0",
           "rollout.mesh.tensor=x": "rollout.mesh.tensor"}
    for override, message in bad.items():
        with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
            rollout_mesh(apply_overrides(Config(), ["rollout.engine=jax", override]).rollout.mesh)
    with pytest.raises(ConfigError, match="rollout.engine = 'vllm'"):
        apply_overrides(Config(), ["rollout.engine=vllm", "rollout.mesh.tensor=4"])
    with pytest.raises(ConfigError, match="rollout.batch_invariant = true"):
        apply_overrides(Config(), ["rollout.engine=jax", "rollout.batch_invariant=true", "rollout.mesh.data=8"])
