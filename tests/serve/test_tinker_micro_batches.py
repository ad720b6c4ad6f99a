"""The learner's micro-batches: a forward_backward call cut into several micro-batches gives, through
the pinned `tinker` SDK, the loss, log-probs and (after optim_step) the weights of the same call run
in one (the second formulation), and the learner records the micro-batch count derived by hand.

Two clients of one LoRA layout and seed (equal initial adapters) send the same call of 10 datums of
5-30 tokens (padded width 32). Client A runs it with a budget above the call (one micro-batch of 12
rows, 10 padded to a multiple of 4), client B with 128 tokens = 4 rows of width 32: rows 4 + 4 + 2,
three micro-batches.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from tests.serve.tinker_setup import datum, ids_of, rl_inputs

TEXT = ("the quick brown fox jumps over the lazy dog while seven small birds sing about the weather "
        "and the river runs past old stone houses toward the quiet blue sea under a pale morning sky")
LENGTHS = (6, 31, 12, 9, 20, 6, 27, 15, 8, 24)  # token ids per datum: model_input 5-30 tokens
SMALL_BUDGET = 4 * 32  # one BATCH_BUCKET of rows at width 32


@contextlib.contextmanager
def _budget(learner, tokens: int):
    saved, learner.micro_batch_tokens = learner.micro_batch_tokens, tokens
    try:
        yield
    finally:
        learner.micro_batch_tokens = saved


def test_pieces_by_hand():
    from jaxrl_llm.serve.tinker.learner import Piece, micro_batches

    # 8 rows: call 0's 3 datums take 4 padded rows, call 1's first 4 fill the rest; then call 1's
    # last 2 (4 rows) and call 2's one datum (4 rows)
    assert micro_batches([3, 6, 1], 8) == [[Piece(0, 0, 3), Piece(1, 0, 4)], [Piece(1, 4, 6), Piece(2, 0, 1)]]
    assert micro_batches([10], 4) == [[Piece(0, 0, 4)], [Piece(0, 4, 8)], [Piece(0, 8, 10)]]
    assert micro_batches([10], 1 << 20) == [[Piece(0, 0, 10)]]
    with pytest.raises(ValueError, match="micro-batch rows=6"):
        micro_batches([10], 6)


def test_a_call_in_micro_batches_equals_the_call_in_one(tinker_server, service_client, tokenizer):
    import jax
    from tinker import types

    service = tinker_server.service
    base = service_client.get_server_capabilities().supported_models[0].model_name
    clients = [service_client.create_lora_training_client(base_model=base, rank=4, seed=51).result()
               for _ in range(2)]
    models = [service.models[c.model_id] for c in clients]
    learner = service.bases[models[0].base_model].learner
    ids = ids_of(tokenizer, TEXT)
    assert len(ids) >= max(LENGTHS)
    data = [datum(ids[:n], **rl_inputs(ids[:n], seed)) for seed, n in enumerate(LENGTHS)]
    adam = types.AdamParams(learning_rate=0.02, beta1=0.9, beta2=0.95, eps=1e-3, weight_decay=0.0)

    outputs, counts = [], []
    for client, budget in zip(clients, (1 << 20, SMALL_BUDGET)):
        before = dict(learner.micro_batch_counts)
        with _budget(learner, budget):
            outputs.append(client.forward_backward(data, "importance_sampling").result())
            client.optim_step(adam).result()
        counts.append({k: v - before.get(k, 0) for k, v in learner.micro_batch_counts.items()
                       if v != before.get(k, 0)})
    assert counts == [{1: 1}, {3: 1}]  # one run each: 12 rows in one; 4 + 4 + 2 rows in three

    whole, cut = outputs
    assert whole.metrics["loss:sum"] != 0
    assert cut.metrics["loss:sum"] == pytest.approx(whole.metrics["loss:sum"], rel=1e-5, abs=1e-6)
    assert len(cut.loss_fn_outputs) == len(data)
    for got, ref, n in zip(cut.loss_fn_outputs, whole.loss_fn_outputs, LENGTHS):
        assert got["logprobs"].to_numpy().shape == (n - 1,)
        np.testing.assert_allclose(got["logprobs"].to_numpy(), ref["logprobs"].to_numpy(), atol=2e-5)
        np.testing.assert_allclose(got["elementwise_loss"].to_numpy(), ref["elementwise_loss"].to_numpy(), atol=2e-5)

    def close(g, e):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=0, atol=1e-4 * float(np.max(np.abs(e))))
    moved = jax.tree.map(lambda a: float(np.max(np.abs(np.asarray(a)))), models[0].adapters["layers"])
    assert any(pair["b"] > 0 for pair in moved.values())  # the step moved the (zero-initialised) B factors
    jax.tree.map(close, models[1].adapters, models[0].adapters)
