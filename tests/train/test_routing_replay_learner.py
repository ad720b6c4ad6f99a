"""Routing replay in the learner (train.routing_replay; train/learn/routing_replay.py) on a tiny
random Qwen3-MoE (hidden 32, 2 layers, 4 experts, top-2).

The "sampler" here is the model's own forward on the unperturbed params: each record's routing
(`RolloutRecord.routed_experts`) is that forward's top-k on the P + L - 1 tokens it would have
forwarded, and its log-probs are that forward's. The learner holds perturbed params (sampler !=
learner). References are computed without the learner's code: one right-padded batch through
`models.forward`, routing rows written by hand from the records."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import core
from jaxrl_llm.models import forward, init_params
from jaxrl_llm.models.config import tiny_decoder_config
from jaxrl_llm.rollout.types import RolloutBatch, RolloutRecord
from jaxrl_llm.train.config import TrainConfig
from jaxrl_llm.train.learn.batch import build_sequences
from jaxrl_llm.train.learn.learner import Learner
from jaxrl_llm.train.learn.micro_batch import head_logprobs
from jaxrl_llm.train.learn.routing_replay import differs_at_heads
from jaxrl_llm.train.learn.step import learn

CFG = tiny_decoder_config(family="qwen3_moe", vocab_size=64, hidden_size=32, intermediate_size=64, num_experts=4,
                          num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)
PROMPT_LENGTHS = [2, 3, 5, 4, 2, 3]  # 3 prompts x G = 2 samples
COMPLETION_LENGTHS = [1, 2, 3, 2, 1, 3]
G, COMPLETION_WIDTH = 2, 4


def _perturbed(params, seed=11, router=0.01, others=0.003):
    """Sampler != learner: noise on every weight, more on the routers."""
    leaves, tree = jax.tree.flatten_with_path(params)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    out = [x + (router if "router" in jax.tree_util.keystr(path) else others) * jax.random.normal(k, x.shape)
           for (path, x), k in zip(leaves, keys)]
    return jax.tree.unflatten(tree, out)


def _right_padded(sequences):
    width = max(len(s) for s in sequences)
    tokens = np.zeros((len(sequences), width), np.int32)
    mask = np.zeros_like(tokens)
    for i, s in enumerate(sequences):
        tokens[i, :len(s)], mask[i, :len(s)] = s, 1
    return tokens, mask


@jax.jit
def _forward(params, tokens, mask, replay):
    return forward(params, CFG, tokens, attention_mask=mask, routing=replay, return_routing=True)


def _gather_completions(records):
    """(rows, positions predicting each completion slot, its token, valid) [N, COMPLETION_WIDTH] index arrays."""
    rows = np.repeat(np.arange(len(records)), COMPLETION_WIDTH).reshape(len(records), COMPLETION_WIDTH)
    at, target, valid = (np.zeros((len(records), COMPLETION_WIDTH), int) for _ in range(3))
    for i, r in enumerate(records):
        p, c = r.prompt_token_ids.size, r.num_completion_tokens
        at[i, :c], target[i, :c], valid[i, :c] = p - 1 + np.arange(c), r.completion_token_ids, 1
    return rows, at, target, valid


def reference_logp(params, records, routing=False):
    """[N, COMPLETION_WIDTH] log-probs of each record's completion tokens (0 after its end) from one
    right-padded forward; ``routing``: replay each record's routed_experts (-1 on the rest)."""
    tokens, mask = _right_padded([np.concatenate([r.prompt_token_ids, r.completion_token_ids]) for r in records])
    replay = None
    if routing:
        replay = np.full(tokens.shape + (CFG.num_layers, CFG.num_experts_per_tok), -1, np.int32)
        for i, r in enumerate(records):
            replay[i, :len(r.routed_experts)] = r.routed_experts
    logp = jax.nn.log_softmax(_forward(params, tokens, mask, replay).out, axis=-1)
    rows, at, target, valid = _gather_completions(records)
    return jnp.where(valid > 0, logp[rows, at, target], 0.0)


def own_experts(params, records):
    """Each record's [P + L - 1, nL, k] experts by the params' own routers (one right-padded forward)."""
    tokens, mask = _right_padded([np.concatenate([r.prompt_token_ids, r.completion_token_ids]) for r in records])
    experts = _forward(params, tokens, mask, None).routing.experts
    return [np.asarray(experts[i, :len(r.prompt_token_ids) + r.num_completion_tokens - 1])
            for i, r in enumerate(records)]


@pytest.fixture(scope="module")
def sampled():
    """(sampler params, learner params, rollouts whose records hold the sampler's routing and log-probs)."""
    params = init_params(CFG, jax.random.PRNGKey(0))
    rng = np.random.default_rng(4)
    bare = [RolloutRecord(i // G, i % G, rng.integers(1, 64, p), rng.integers(1, 64, c), np.zeros(c), "length", 0)
            for i, (p, c) in enumerate(zip(PROMPT_LENGTHS, COMPLETION_LENGTHS))]
    logp = np.asarray(reference_logp(params, bare))
    routing = own_experts(params, bare)
    records = tuple(dataclasses.replace(r, sampler_logprobs=logp[i, :r.num_completion_tokens],
                                        routed_experts=routing[i]) for i, r in enumerate(bare))
    return params, _perturbed(params), RolloutBatch(records, len(records) // G, G)


@functools.partial(jax.jit, static_argnames="max_segments")
def routed_heads(params, micro, routing, max_segments):
    """The learner's micro-batch forward (`head_logprobs`) replaying ``routing``; -> the Routing it used."""
    return head_logprobs(params, CFG, *micro, temperature=1.0, return_entropy=False, remat="off",
                         max_segments=max_segments, return_routing=True, routing=routing)[2]


def make_learner(mode, **train):
    train_cfg = dataclasses.replace(TrainConfig(), precision="fp32", lr=1e-3, routing_replay=mode, **train)
    return Learner(CFG, core.get_recipe("grpo"), train_cfg, total_steps=4)


@pytest.fixture(scope="module")
def learners():
    """One learner per mode for the whole module: their compiled programs are reused across tests."""
    return {mode: make_learner(mode) for mode in ("off", "sampler")}


def test_replayed_routing_equals_the_record_through_packed_rows(sampled):
    """(a) Several sequences of different lengths packed into rows, over several micro-batches: the
    experts the learner's forward routes each real token to are the record's, on every token that has
    one, recovered by matching each packed segment's tokens to its sample."""
    _, learner_params, rollouts = sampled
    learner = make_learner("sampler", micro_batch_tokens=2 * (8 + COMPLETION_WIDTH))  # 2 rows per micro-batch
    seq = build_sequences(rollouts, completion_width=COMPLETION_WIDTH, prompt_bucket=8)
    plan = learner.plan(seq)
    rows = learner.place.rows(plan)
    assert plan.max_segments >= 2 and plan.used.sum() >= 2  # packed, and more than one micro-batch
    by_tokens = {tuple(np.concatenate([r.prompt_token_ids, r.completion_token_ids])): r for r in rollouts.records}
    checked = 0
    for m in np.flatnonzero(plan.used):
        micro = (rows.tokens[m], rows.segment_ids[m], rows.positions[m], rows.head_slots[m])
        experts = np.asarray(routed_heads(learner_params, micro, rows.routing[m], plan.max_segments).experts)
        for row in range(plan.tokens.shape[1]):
            for segment in set(plan.segment_ids[m, row].tolist()) - {0}:
                slots = np.flatnonzero(plan.segment_ids[m, row] == segment)
                record = by_tokens[tuple(plan.tokens[m, row, slots])]
                forwarded = len(record.routed_experts)
                np.testing.assert_array_equal(experts[row, slots[:forwarded]], record.routed_experts)
                checked += forwarded
    assert checked == sum(len(r.routed_experts) for r in rollouts.records)


def test_pi_old_replays_the_record(sampled, learners):
    """The learner's pi_old under replay equals an unpacked forward that replays the records (a
    second formulation); without replay it does not."""
    _, learner_params, rollouts = sampled
    seq = build_sequences(rollouts, completion_width=COMPLETION_WIDTH, prompt_bucket=8)
    mask = seq.completion_mask > 0
    want = np.asarray(reference_logp(learner_params, rollouts.records, routing=True))[mask]
    replayed = np.asarray(learners["sampler"].logprobs(learner_params, seq)[0])[mask]
    np.testing.assert_allclose(replayed, want, rtol=1e-5, atol=1e-5)
    off = np.asarray(learners["off"].logprobs(learner_params, seq)[0])[mask]
    assert np.max(np.abs(off - want)) > 1e-3


def test_gradient_pass_replays_the_record(sampled, learners):
    """The learner's loss and gradients under replay equal jax.grad of the same recipe loss on an
    unpacked forward that replays the records."""
    _, learner_params, rollouts = sampled
    seq = build_sequences(rollouts, completion_width=COMPLETION_WIDTH, prompt_bucket=8)
    replayed = learners["sampler"]
    rewards = jnp.asarray([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    inputs = core.StepInputs(rewards, jnp.asarray(seq.completion_mask), jnp.asarray(seq.sampler_logp),
                             jnp.asarray(seq.sampler_logp))  # pi_old := mu, so the ratio is not 1
    batch, _ = core.prepare_step_batch(replayed.recipe, inputs)

    def reference_loss(params):
        return core.recipe_loss(replayed.recipe, reference_logp(params, rollouts.records, routing=True), batch)[0]

    want_loss, want_grads = jax.jit(jax.value_and_grad(reference_loss))(learner_params)
    loss, grads, _ = replayed.loss_and_grads(learner_params, seq, batch)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-4, atol=1e-8)
    scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(want_grads))
    for got, ref in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-3, atol=1e-5 * scale)


def _learn_metrics(learner, params, rollouts):
    rewards = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]], np.float32)
    return learn(learner, learner.init(params), rollouts, core.StepInputs(rewards),
                 completion_width=COMPLETION_WIDTH)[1]


def _expected_differs_frac(params, rollouts):
    """The share of completion tokens whose predicting position's top-k set differs from the record's
    in some layer, from an unpacked forward of ``params`` and numpy sets."""
    own = own_experts(params, rollouts.records)
    differing = total = 0
    for mine, r in zip(own, rollouts.records):
        p, c = r.prompt_token_ids.size, r.num_completion_tokens
        for position in range(p - 1, p - 1 + c):
            differing += any(set(mine[position, layer]) != set(r.routed_experts[position, layer])
                             for layer in range(CFG.num_layers))
            total += 1
    return differing / total


def test_differs_frac_and_mismatch_k3_with_and_without_replay(sampled, learners):
    """(b) The perturbed learner routes some completion tokens otherwise than the sampler:
    routing/differs_frac > 0, equal to a numpy count on an unpacked forward, and measured without
    replay in both modes; under replay the routing the learner uses differs on none.
    (c) mismatch k3 between the sampler's log-probs and the learner's pi_old is lower with replay."""
    sampler_params, learner_params, rollouts = sampled
    off = _learn_metrics(learners["off"], learner_params, rollouts)
    on = _learn_metrics(learners["sampler"], learner_params, rollouts)
    expected = _expected_differs_frac(learner_params, rollouts)
    assert 0 < expected < 1
    assert off["routing/differs_frac"] == pytest.approx(expected, abs=1e-6)
    assert on["routing/differs_frac"] == pytest.approx(expected, abs=1e-6)
    assert _learn_metrics(learners["off"], sampler_params, rollouts)["routing/differs_frac"] == 0.0  # sampler's own

    seq = build_sequences(rollouts, completion_width=COMPLETION_WIDTH, prompt_bucket=8)
    learner = learners["sampler"]
    plan = learner.plan(seq)
    rows = learner.place.rows(plan)
    for m in np.flatnonzero(plan.used):
        micro = (rows.tokens[m], rows.segment_ids[m], rows.positions[m], rows.head_slots[m])
        used = routed_heads(learner_params, micro, rows.routing[m], plan.max_segments)
        assert float(jnp.sum(differs_at_heads(used.experts, rows.routing[m], rows.head_slots[m]))) == 0.0

    mask = seq.completion_mask
    k3 = {}
    for mode, routing in (("off", False), ("sampler", True)):
        log_ratio = np.asarray(reference_logp(learner_params, rollouts.records, routing=routing)) - seq.sampler_logp
        k3[mode] = float(np.sum(mask * (np.expm1(log_ratio) - log_ratio)) / np.sum(mask))  # pi_old / mu
    assert off["routing/mismatch_k3_replay_off"] == pytest.approx(k3["off"], rel=1e-3)
    assert on["routing/mismatch_k3_replay_sampler"] == pytest.approx(k3["sampler"], rel=1e-3)
    assert on["routing/mismatch_k3_replay_sampler"] < off["routing/mismatch_k3_replay_off"]
    assert "routing/mismatch_k3_replay_sampler" not in off and "routing/mismatch_k3_replay_off" not in on


def test_a_missing_record_is_named(sampled, learners):
    _, learner_params, rollouts = sampled
    records = list(rollouts.records)
    records[3] = dataclasses.replace(records[3], routed_experts=None)
    with pytest.raises(ValueError, match=r"routing_replay='sampler', but sample \(prompt_index=1, sample_index=1\) "
                                         r"has no routed_experts record"):
        _learn_metrics(learners["sampler"], learner_params, RolloutBatch(tuple(records), 3, G))
    off = _learn_metrics(learners["off"], learner_params, RolloutBatch(tuple(records), 3, G))  # off: the metrics skip it
    assert 0 < off["routing/differs_frac"] < 1


def test_a_dense_policy_is_refused_naming_its_architecture():
    dense = tiny_decoder_config(vocab_size=64)
    with pytest.raises(ValueError, match=r"routing_replay='sampler' needs a mixture-of-experts policy; the policy is "
                                         r"LlamaForCausalLM \(dense\)"):
        Learner(dense, core.get_recipe("grpo"), dataclasses.replace(TrainConfig(), routing_replay="sampler"),
                total_steps=1)


def test_replay_on_a_mesh_equals_one_device(sampled, learners):
    """The routing rows split over the batch axes like the tokens (`Placement.rows`): on an 8-device
    (data 2, fsdp 2, tensor 2) mesh the replayed pi_old and loss equal the single-device learner's."""
    from jaxrl_llm.models import make_mesh

    _, learner_params, rollouts = sampled
    seq = build_sequences(rollouts, completion_width=COMPLETION_WIDTH, prompt_bucket=8)
    one = learners["sampler"]
    train_cfg = dataclasses.replace(TrainConfig(), precision="fp32", lr=1e-3, routing_replay="sampler")
    meshed = Learner(CFG, core.get_recipe("grpo"), train_cfg, total_steps=4, mesh=make_mesh(data=2, fsdp=2, tensor=2))
    mask = seq.completion_mask > 0
    want = np.asarray(one.logprobs(learner_params, seq)[0])
    got = np.asarray(meshed.logprobs(meshed.init(learner_params).params, seq)[0])
    np.testing.assert_allclose(got[mask], want[mask], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(want[mask], np.asarray(reference_logp(learner_params, rollouts.records, True))[mask],
                               rtol=1e-5, atol=1e-5)
