"""Several clients' forward_backward calls, queued together, run as one forward (the learner's
`forwards` counter) and each client gets its own loss, log-probs, gradient and AdamW step, through
the pinned `tinker` SDK.

Three clients of different LoRA layouts (ranks 4 and 8; all projections, attention only, no LM-head
adapter) and different losses (cross_entropy, ppo, importance_sampling) queue one forward_backward
each while the server's worker is held, twice, with an optim_step each in between (so the second
round runs on non-zero, different adapters). The expected numbers come from a second formulation:
`jax.grad` of each client's loss alone on MERGED params (W + s A B, `models.lora.merge`, scored by
`models.token_logprobs`; the server applies the adapters unmerged, per row group, several clients
in one forward), and `optax.adamw` for the step. AdamParams.eps = 1e-3 makes the first step a
continuous function of the gradient (with eps -> 0 it is lr * sign(g), which float noise can flip).
"""
from __future__ import annotations

import functools
import threading
import time

import numpy as np
import pytest

from tests.serve.tinker_setup import TEXTS, datum, ids_of, rl_inputs

LAYOUTS = ({"rank": 4, "seed": 31}, {"rank": 8, "seed": 32, "train_mlp": False},
           {"rank": 4, "seed": 33, "train_unembed": False})
LOSSES = (("cross_entropy", None), ("ppo", {"clip_low_threshold": 0.7, "clip_high_threshold": 1.3}),
          ("importance_sampling", None))


def _clients(service_client) -> list:
    base = service_client.get_server_capabilities().supported_models[0].model_name
    return [service_client.create_lora_training_client(base_model=base, **layout).result() for layout in LAYOUTS]


def _calls(tokenizer) -> list:
    """(data, loss_fn, config) per client: 2, 1 and 3 datums."""
    ids = [ids_of(tokenizer, t) for t in TEXTS + ("a b c d e f g h", "red green blue")]
    ce = [datum(i, weights=np.linspace(0.2, 1.0, len(i) - 1).tolist()) for i in ids[:2]]
    rl = [datum(i, **rl_inputs(i, seed)) for seed, i in enumerate(ids)]
    return [(ce, *LOSSES[0]), (rl[1:2], *LOSSES[1]), (rl[1:], *LOSSES[2])]


def _held(server):
    """Holds the server's worker until the returned event is set (the calls sent meanwhile queue up)."""
    from jaxrl_llm.serve.tinker.jobs import Result

    release = threading.Event()
    server.jobs.submit(None, "test-hold", lambda: (release.wait(120), Result(json={}))[1])
    _wait_for(lambda: server.jobs.queued() == 0)  # the worker took it
    return release


def _wait_for(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _run_together(server, clients, calls) -> list:
    """Each client's forward_backward queued while the worker is held, then run: their outputs."""
    release = _held(server)
    futures = [client.forward_backward(*call) for client, call in zip(clients, calls)]
    _wait_for(lambda: server.jobs.queued() == len(calls))
    release.set()
    return [f.result() for f in futures]


WIDTH = 64


def _arrays(data) -> tuple[np.ndarray, dict, np.ndarray, list[int]]:
    """tokens [B, WIDTH + 1] (model_input and the last target), loss inputs and valid [B, WIDTH], lengths."""
    n = [len(d.model_input.to_ints()) for d in data]
    tokens, valid = np.zeros((len(data), WIDTH + 1), np.int32), np.zeros((len(data), WIDTH), bool)
    inputs = {k: np.zeros((len(data), WIDTH), np.float32) for k in data[0].loss_fn_inputs if k != "target_tokens"}
    for row, d in enumerate(data):
        tokens[row, :n[row] + 1] = d.model_input.to_ints() + [int(d.loss_fn_inputs["target_tokens"].data[-1])]
        valid[row, :n[row]] = True
        for k in inputs:
            inputs[k][row, :n[row]] = d.loss_fn_inputs[k].data
    return tokens, inputs, valid, n


@functools.lru_cache(maxsize=None)
def _by_hand(cfg, scale: float, loss_fn: str, config: tuple):
    """jitted (base params, adapters, tokens, inputs, valid) -> ((loss, log-probs), gradient) of one
    client alone, on merged params: models.lora.merge and the LM head W + s A B."""
    import jax
    import jax.numpy as jnp

    from jaxrl_llm.models import lora, token_logprobs
    from jaxrl_llm.serve.tinker.losses import LOSSES as TINKER_LOSSES

    def loss(adapters, base, tokens, inputs, valid):
        params = lora.merge(base, adapters, scale) if adapters["layers"] else dict(base)
        if "lm_head" in adapters:
            head = adapters["lm_head"]
            params["lm_head"] = params["lm_head"] + scale * jnp.dot(head["a"], head["b"], precision="highest")
        logp = token_logprobs(params, cfg, tokens)
        return jnp.sum(TINKER_LOSSES[loss_fn].per_token(logp, inputs, dict(config), valid)), logp

    return jax.jit(jax.value_and_grad(loss, has_aux=True))


def _expected(service, model_id: str, adapters, call) -> tuple[float, list[np.ndarray], dict]:
    data, loss_fn, config = call
    model = service.models[model_id]
    base = service.bases[model.base_model]
    tokens, inputs, valid, n = _arrays(data)
    fn = _by_hand(base.cfg, model.config.scale, loss_fn, tuple(sorted((config or {}).items())))
    (total, logp), grads = fn(adapters, base.params, tokens, inputs, valid)
    return float(total), [np.asarray(logp)[row, :k] for row, k in enumerate(n)], grads


def _assert_trees_close(got, expected, rel: float) -> None:
    """Every leaf within rel * (the leaf's largest expected magnitude)."""
    import jax

    def close(g, e):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=0, atol=rel * float(np.max(np.abs(e))))
    jax.tree.map(close, got, expected)


def _forwards_since(learner, before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in learner.forwards.items() if v != before.get(k, 0)}


def test_queued_clients_run_as_one_forward_and_each_gets_its_own_result(tinker_server, service_client, tokenizer):
    import optax
    from tinker import types

    service = tinker_server.service
    clients = _clients(service_client)
    models = [service.models[c.model_id] for c in clients]
    learner = service.bases[models[0].base_model].learner
    calls = _calls(tokenizer)
    adam = types.AdamParams(learning_rate=0.02, beta1=0.9, beta2=0.95, eps=1e-3, weight_decay=0.0)
    by_hand_adam = optax.adamw(0.02, b1=0.9, b2=0.95, eps=1e-3, weight_decay=0.0)
    for round_ in range(2):  # round 0 on fresh adapters (B = 0), round 1 after one AdamW step each
        before = dict(learner.forwards)
        start = [m.adapters for m in models]
        outputs = _run_together(tinker_server, clients, calls)
        assert _forwards_since(learner, before) == {3: 1}
        for model, call, adapters, got in zip(models, calls, start, outputs):
            loss, logprobs, grads = _expected(service, model.model_id, adapters, call)
            assert got.metrics["loss:sum"] == pytest.approx(loss, rel=1e-5, abs=1e-5)
            for out, ref in zip(got.loss_fn_outputs, logprobs):
                np.testing.assert_allclose(out["logprobs"].to_numpy(), ref, atol=2e-5)
            _assert_trees_close(model.grads, grads, 1e-4)
            if round_ == 0:
                client = clients[models.index(model)]
                client.optim_step(adam).result()
                update, _ = by_hand_adam.update(grads, by_hand_adam.init(adapters), adapters)
                _assert_trees_close(model.adapters, optax.apply_updates(adapters, update), 1e-4)
        if round_ == 0:  # round 1 runs on non-zero LoRA B factors
            assert all(np.any(np.asarray(pair["b"])) for m in models for pair in m.adapters["layers"].values())
