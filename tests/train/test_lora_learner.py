"""The LoRA learner against independent references: PyTorch autograd through the
transformers model with W + s * (A B)^T for the adapter gradients, hand-derived
Adam behaviour at B = 0, the JAX sampler's logprobs after a merged sync, and the
RL loop's adapter-only checkpoints and `export --merged` vs a numpy merge."""
import dataclasses
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from jaxrl_llm import bridge, cli, core
from jaxrl_llm.models import init_params, lora
from jaxrl_llm.models.config import tiny_decoder_config
from jaxrl_llm.rollout.jax_sampler import JaxSampler
from jaxrl_llm.rollout.types import SamplingParams
from jaxrl_llm.train.run import loop
from jaxrl_llm.train.policy import load_policy
from jaxrl_llm.train.run.run_state import checkpoint_state, restore_params
from jaxrl_llm.train.learn.batch import build_sequences
from jaxrl_llm.train.run.checkpoint import Checkpointer
from jaxrl_llm.train.config import TrainConfig, load_config
from jaxrl_llm.train.learn.learner import Learner
from tests.models.hf_reference import hf_model, our_config_and_params, torch

REPO = Path(__file__).resolve().parents[2]
TEMPERATURE = 0.9
PROMPTS = [[5, 17, 3], [9, 2, 44, 61, 8], [70, 12], [33]]
G = 4
MAX_TOKENS = 6
HF_MODULES = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
              "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
              "down_proj": "mlp.down_proj"}


@pytest.fixture(scope="module")
def setup():
    model = hf_model("llama_tied", seed=5)
    cfg, params = our_config_and_params(model)
    rollouts = JaxSampler(cfg, params, eos_token_ids=[96]).generate(
        PROMPTS, n=G, params=SamplingParams(temperature=TEMPERATURE, max_tokens=MAX_TOKENS, seed=3))
    seq = build_sequences(rollouts, completion_width=MAX_TOKENS, prompt_bucket=8)
    rewards = np.random.default_rng(0).integers(0, 2, size=(len(PROMPTS), G)).astype(np.float32)
    return model, cfg, params, seq, rewards


def make_learner(cfg, recipe="grpo", **train):
    train_cfg = dataclasses.replace(TrainConfig(), **{"precision": "fp32", "lr": 1e-2, "micro_batch_size": 8,
                                                      **train})
    return Learner(cfg, core.get_recipe(recipe), train_cfg, total_steps=10, temperature=TEMPERATURE)


def step_batch_for(learner, params, seq, rewards):
    old_logp, _ = learner.logprobs(params, seq)
    batch, _ = core.prepare_step_batch(learner.recipe, core.StepInputs(jnp.asarray(rewards),
                                                                       jnp.asarray(seq.completion_mask), old_logp,
                                                                       jnp.asarray(seq.sampler_logp)))
    return batch


def with_random_b(adapters, seed=11):
    """B drawn non-zero, so the gradient of A (s * X^T dY B^T) is not trivially zero."""
    rng = np.random.default_rng(seed)
    return {"layers": {
        name: {"a": pair["a"], "b": jnp.asarray(0.5 * rng.standard_normal(pair["b"].shape), jnp.float32)}
        for name, pair in adapters["layers"].items()}}


def test_zero_init_lora_learner_equals_full_learner(setup):
    _, cfg, params, seq, _ = setup
    full = make_learner(cfg)
    lora_learner = make_learner(cfg, lora_rank=4)
    want, _ = full.logprobs(full.init(params).params, seq)
    got, _ = lora_learner.logprobs(lora_learner.init(params).params, seq)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_adapter_gradients_match_torch_autograd(setup):
    """At pi = pi_old the loss gradient is -sum w A d log pi; torch builds the same loss on
    the transformers model whose projections are W + s * (A_l B_l)^T, A and B leaf tensors."""
    model, cfg, params, seq, rewards = setup
    learner = make_learner(cfg, lora_rank=2, lora_alpha=3.0, micro_batch_size=4)
    adapters = with_random_b(learner.init(params, seed=1).params)
    batch = step_batch_for(learner, adapters, seq, rewards)
    loss, grads, _ = learner.loss_and_grads(adapters, seq, batch)
    assert set(grads) == {"layers"} and set(grads["layers"]) == set(HF_MODULES)  # no base gradients

    leaves = {name: {k: torch.tensor(np.asarray(v), requires_grad=True)
                     for k, v in pair.items()} for name, pair in adapters["layers"].items()}
    weights = {name: p.detach() for name, p in model.named_parameters()}
    for name, pair in leaves.items():
        for layer in range(cfg.num_layers):
            key = f"model.layers.{layer}.{HF_MODULES[name]}.weight"
            weights[key] = weights[key] + 1.5 * (pair["a"][layer] @ pair["b"][layer]).T  # alpha/r = 3/2
    logits = torch.func.functional_call(model, weights, (torch.tensor(seq.tokens),), dict(
        attention_mask=torch.tensor(seq.attention_mask),
        position_ids=torch.tensor(seq.positions.astype(np.int64)))).logits.double()
    logp_all = torch.log_softmax(logits[:, :-1] / TEMPERATURE, dim=-1)
    logp = torch.gather(logp_all, 2, torch.tensor(seq.tokens[:, 1:].astype(np.int64))[..., None])[..., 0]
    w = seq.prompt_width
    logp = logp[:, w - 1:w - 1 + MAX_TOKENS]
    coef = torch.tensor(np.asarray(batch.loss_weights * batch.advantages * batch.correction_weights),
                        dtype=torch.float64)
    torch_loss = -(coef * torch.exp(logp - logp.detach())).sum()
    torch_loss.backward()
    np.testing.assert_allclose(float(loss), float(torch_loss.detach()), rtol=1e-5, atol=1e-7)
    for name, pair in leaves.items():
        for k in ("a", "b"):
            ref = pair[k].grad.double().numpy()
            ours = np.asarray(grads["layers"][name][k], np.float64)
            assert np.abs(ref).max() > 1e-6, (name, k)
            assert np.abs(ours - ref).max() / np.abs(ref).max() < 1e-4, (name, k)


def test_updates_train_only_the_adapters(setup):
    """Base weights never change; optimiser state exists only for adapters. At B = 0,
    dL/dA = s X^T dY B^T = 0, so Adam leaves A exactly as it was on the first step
    (m = v = 0 gives a zero update) while B moves; on the second step A moves too."""
    _, cfg, params, seq, rewards = setup
    learner = make_learner(cfg, lora_rank=1, weight_decay=0.0)
    state = learner.init(params)
    base_before = jax.tree.map(np.array, learner.frozen)
    adapters0 = jax.tree.map(np.array, state.params)
    opt_arrays = [x for x in jax.tree.leaves(state.opt_state) if np.ndim(x) > 0]
    assert sorted(x.shape for x in opt_arrays) == sorted(2 * [x.shape for x in jax.tree.leaves(state.params)])
    assert lora.tree_bytes(opt_arrays) == 2 * lora.tree_bytes(state.params)

    state, metrics = learner.update(state, seq, step_batch_for(learner, state.params, seq, rewards))
    assert float(metrics["skipped"]) == 0.0
    for name, pair in state.params["layers"].items():
        np.testing.assert_array_equal(np.asarray(pair["a"]), adapters0["layers"][name]["a"])
        assert np.any(np.asarray(pair["b"]) != 0), name
    state, _ = learner.update(state, seq, step_batch_for(learner, state.params, seq, rewards))
    assert all(np.any(np.asarray(p["a"]) != adapters0["layers"][n]["a"]) for n, p in state.params["layers"].items())
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, learner.frozen), base_before)
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, learner.frozen),
                 jax.tree.map(np.asarray, dict(params)))


def test_sampler_logprobs_after_merged_sync_match_the_learner(setup):
    _, cfg, params, seq, rewards = setup
    learner = make_learner(cfg, lora_rank=2)
    state = learner.init(params)
    for _ in range(2):
        state, _ = learner.update(state, seq, step_batch_for(learner, state.params, seq, rewards))
    sampler = JaxSampler(cfg, params, eos_token_ids=[96])
    sampler.update_weights(learner.full_params(state.params))  # what loop.run_step sends
    rollouts = sampler.generate(PROMPTS, n=G, params=SamplingParams(temperature=TEMPERATURE,
                                                                    max_tokens=MAX_TOKENS, seed=4))
    new_seq = build_sequences(rollouts, completion_width=MAX_TOKENS, prompt_bucket=8)
    mask = new_seq.completion_mask > 0
    learner_logp, _ = learner.logprobs(state.params, new_seq)
    np.testing.assert_allclose(np.asarray(learner_logp)[mask], new_seq.sampler_logp[mask], atol=2e-5)
    full = make_learner(cfg)
    base_logp, _ = full.logprobs(full.init(params).params, new_seq)
    assert np.abs(np.asarray(base_logp) - np.asarray(learner_logp))[mask].max() > 1e-3  # the sync mattered


@pytest.mark.slow
def test_mesh_learner_keeps_base_sharded_and_matches_single_device(setup):
    _, cfg, params, seq, rewards = setup
    from jaxrl_llm.models import make_mesh

    single = make_learner(cfg, lora_rank=2, micro_batch_size=2)
    adapters = with_random_b(single.init(params).params)
    batch = step_batch_for(single, adapters, seq, rewards)
    loss1, grads1, _ = single.loss_and_grads(adapters, seq, batch)
    sharded = Learner(cfg, single.recipe, single.train_cfg, total_steps=10, temperature=TEMPERATURE,
                      mesh=make_mesh(data=2, fsdp=2, tensor=2))
    sharded.init(params)
    loss2, grads2, _ = sharded.loss_and_grads(adapters, seq, batch)
    assert abs(float(loss1) - float(loss2)) <= 1e-6
    # sharded sums reduce in another order: compare relative to each gradient's size
    rel = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(a))), grads1, grads2)
    assert max(jax.tree.leaves(rel)) <= 1e-4  # float32: ~1e-5 observed
    assert not sharded.frozen["layers"]["q_proj"].sharding.is_fully_replicated


# ----------------------------------------------------------------- RL loop + export
@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> str:
    """A random 2-layer decoder with SmolLM2's tokenizer files (prompts tokenise for real)."""
    cfg = tiny_decoder_config()
    out = tmp_path_factory.mktemp("tiny") / "model"
    bridge.save_hf_dir(cfg, init_params(cfg, jax.random.key(0)), out, tokenizer_dir=bridge.smollm2_hf_dir())
    return str(out)


def lora_overrides(model_dir, run_dir):
    return ["rollout.engine=jax", "total_steps=1", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4",
            "rollout.max_tokens=6",
            "train.micro_batch_size=4", "train.lr=1e-2", "checkpoint.every_steps=1", "checkpoint.async_save=false",
            "metrics.tensorboard=false", "task.eval_size=4", "task.eval_samples=2", "train.lora_rank=1",
            "train.lora_alpha=4", "train.lora_targets=q_proj,v_proj,down_proj",
            f"model.source={model_dir}", f"run_dir={run_dir}"]


def test_loop_checkpoints_adapters_and_export_merged(tiny_model_dir, tmp_path, capsys):
    """The loop's checkpoint holds adapters + base path/sha256 only; `export --merged` writes
    W + alpha/r * (A B) in HF layout (checked in numpy); another base is refused."""
    overrides = lora_overrides(tiny_model_dir, tmp_path / "run")
    experiment = str(REPO / "experiments/demo.py")
    cfg = load_config(experiment, overrides)
    out = loop.train(cfg)
    assert out.step == 1
    with Checkpointer(cfg.checkpoint_path, every_steps=0, keep=3) as ckpt:
        raw = ckpt.restore(step=1)  # no target: exactly what is on disk
        saved_params = raw.state["learner"]["params"]
        assert set(saved_params) == {"layers"} and set(saved_params["layers"]) == {"q_proj", "v_proj", "down_proj"}
        assert np.shape(saved_params["layers"]["q_proj"]["a"]) == (2, 32, 1)
        assert raw.metadata["lora"]["base_model_dir"] == os.path.abspath(tiny_model_dir)
        assert raw.metadata["lora"]["base_sha256"] == lora.base_fingerprint(tiny_model_dir)
        # A random model earns no reward here, so B is still 0: store a step 2 with B drawn,
        # so that the merged export below is not trivially the base.
        state = out.state
        adapters = with_random_b(state.params)
        ckpt.save(2, checkpoint_state(state._replace(params=adapters), 2, 1), metadata=raw.metadata,
                  force=True)

    assert cli.main(["export", "--out", str(tmp_path / "nope"), "--config", experiment, *overrides]) == 2
    assert "pass --merged" in capsys.readouterr().err
    assert cli.main(["export", "--merged", "--out", str(tmp_path / "hf"), "--config", experiment, *overrides]) == 0
    exported = load_file(str(tmp_path / "hf" / "model.safetensors"))
    base = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    for name, hf in HF_MODULES.items():
        for layer in range(2):
            key = f"model.layers.{layer}.{hf}.weight"
            want = base[key].astype(np.float64)
            if name in adapters["layers"]:
                a, b = (np.asarray(adapters["layers"][name][k], np.float64) for k in ("a", "b"))
                want = want + 4.0 * (a[layer] @ b[layer]).T  # alpha / r = 4 / 1
            np.testing.assert_allclose(exported[key], want, rtol=0, atol=1e-6, err_msg=key)
    assert os.path.exists(tmp_path / "hf" / "tokenizer.json")
    np.testing.assert_array_equal(exported["model.embed_tokens.weight"], base["model.embed_tokens.weight"])

    other_cfg, other = bridge.load_hf_dir(tiny_model_dir)
    other = dict(other, final_norm=np.asarray(other["final_norm"]) * 2)
    other_dir = bridge.save_hf_dir(other_cfg, other, tmp_path / "other", tokenizer_dir=tiny_model_dir)
    with pytest.raises(ValueError, match=r"trained on base .*model \(sha256 [0-9a-f]{12}\.\.\.\), but model.source "
                                         r"gives .*other"):
        restore_params(cfg, load_policy(other_dir))


def test_lora_config_fields_are_validated():
    from jaxrl_llm.train.config import ConfigError, Config, apply_overrides

    cfg = apply_overrides(Config(), ["train.lora_rank=8", "train.lora_alpha=16", "train.lora_targets=q_proj,v_proj"])
    spec = lora.spec_from_train_config(cfg.train)
    assert (spec.rank, spec.scale, spec.targets) == (8, 2.0, ("q_proj", "v_proj"))
    assert lora.spec_from_train_config(Config().train) is None  # default: full fine-tuning
    with pytest.raises(ConfigError, match=r"train.lora_targets = \('q_proj', 'embed'\) is invalid; valid: distinct"):
        apply_overrides(Config(), ["train.lora_targets=q_proj,embed"])
    with pytest.raises(ConfigError, match=r"train.lora_rank = -1 is out of range; valid: >= 0"):
        apply_overrides(Config(), ["train.lora_rank=-1"])
