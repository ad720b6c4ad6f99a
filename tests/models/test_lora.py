"""LoRA adapters (models.lora) against independent references: the base model's own
logits, a float64 numpy W + alpha/r * A @ B, and the HF tensors written by the bridge."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from jaxrl_llm import bridge
from jaxrl_llm.models import forward, lora
from tests.models.hf_reference import hf_model, our_config_and_params

TOKENS = np.array([[5, 17, 3, 88, 41, 2, 60, 9], [9, 2, 44, 61, 8, 0, 0, 0]], np.int32)
MASK = np.array([[1] * 8, [1] * 5 + [0] * 3], np.int32)


@pytest.fixture(scope="module")
def tiny():
    model = hf_model("qwen2_qkv_bias", seed=2)
    cfg, params = our_config_and_params(model)
    return model, cfg, jax.tree.map(jnp.asarray, params)


def random_adapters(base, spec, seed):
    """Adapters with B drawn too (B = 0 would make every merge trivially exact)."""
    adapters = lora.init_adapters(base, spec, jax.random.PRNGKey(seed))
    keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(spec.targets))
    for key, name in zip(keys, spec.targets):
        b = adapters["layers"][name]["b"]
        adapters["layers"][name]["b"] = 0.3 * jax.random.normal(key, b.shape, b.dtype)
    return adapters


def numpy_merge(base, adapters, scale):
    """Float64 reference: W + scale * A @ B, layer by layer."""
    merged = {name: np.asarray(w, np.float64) for name, w in base["layers"].items()}
    for name, pair in adapters["layers"].items():
        a, b = np.asarray(pair["a"], np.float64), np.asarray(pair["b"], np.float64)
        merged[name] = merged[name] + scale * np.stack([a[i] @ b[i] for i in range(a.shape[0])])
    return merged


def test_zero_b_gives_the_base_model_exactly(tiny):
    _, cfg, base = tiny
    spec = lora.LoraSpec(rank=4, alpha=16.0)
    adapters = lora.init_adapters(base, spec, jax.random.PRNGKey(0))
    for pair in adapters["layers"].values():
        assert np.all(np.asarray(pair["b"]) == 0) and np.any(np.asarray(pair["a"]) != 0)
    base_logits, _ = forward(base, cfg, jnp.asarray(TOKENS), attention_mask=jnp.asarray(MASK))
    lora_logits, _ = forward(lora.merge(base, adapters, spec.scale), cfg, jnp.asarray(TOKENS),
                             attention_mask=jnp.asarray(MASK))
    np.testing.assert_array_equal(np.asarray(lora_logits), np.asarray(base_logits))


def test_adapter_shapes_and_init_scale(tiny):
    _, cfg, base = tiny
    spec = lora.LoraSpec(rank=3, alpha=6.0, targets=("q_proj", "down_proj"))
    adapters = lora.init_adapters(base, spec, jax.random.PRNGKey(1))
    assert sorted(adapters["layers"]) == ["down_proj", "q_proj"]
    layers = cfg.num_layers
    assert adapters["layers"]["q_proj"]["a"].shape == (layers, cfg.hidden_size, 3)
    assert adapters["layers"]["q_proj"]["b"].shape == (layers, 3, cfg.q_dim)
    assert adapters["layers"]["down_proj"]["a"].shape == (layers, cfg.intermediate_size, 3)
    assert adapters["layers"]["down_proj"]["b"].shape == (layers, 3, cfg.hidden_size)
    a = np.asarray(adapters["layers"]["down_proj"]["a"])  # N(0, 1/in): 2*48*3 = 288 draws
    assert abs(a.std() * np.sqrt(cfg.intermediate_size) - 1.0) < 0.15
    assert spec.scale == 2.0
    shapes = lora.adapter_shapes(base, spec)
    assert jax.tree.map(lambda s: s.shape, shapes) == jax.tree.map(lambda x: x.shape, adapters)
    # bytes: 2 layers x (32*3 + 3*32 + 48*3 + 3*32) float32 values
    assert lora.tree_bytes(adapters) == 4 * 2 * (32 * 3 + 3 * 32 + 48 * 3 + 3 * 32)


def test_merge_equals_numpy_w_plus_scaled_a_b(tiny):
    _, _, base = tiny
    spec = lora.LoraSpec(rank=2, alpha=5.0, targets=("q_proj", "v_proj", "o_proj", "up_proj"))
    adapters = random_adapters(base, spec, seed=3)
    merged = jax.jit(lora.merge, static_argnums=2)(base, adapters, spec.scale)
    expected = numpy_merge(base, adapters, 2.5)
    for name, want in expected.items():
        np.testing.assert_allclose(np.asarray(merged["layers"][name], np.float64), want, rtol=0, atol=1e-6,
                                   err_msg=name)
    untouched = [k for k in base["layers"] if k not in spec.targets]
    assert "k_proj" in untouched and "q_bias" in untouched
    eager = lora.merge(base, adapters, spec.scale)
    for name in untouched:  # the very same arrays, not copies
        np.testing.assert_array_equal(np.asarray(merged["layers"][name]), np.asarray(base["layers"][name]))
        assert eager["layers"][name] is base["layers"][name]
    assert eager["embed"] is base["embed"]


def test_merged_export_is_base_plus_scaled_a_b_in_hf_layout(tiny, tmp_path):
    """save_hf_dir(merge(...)) holds (W + s A B)^T under HF names (computed here from the
    transformers state dict in numpy), and loading it back gives the merged params."""
    model, cfg, base = tiny
    spec = lora.LoraSpec(rank=1, alpha=2.0)
    adapters = random_adapters(base, spec, seed=7)
    out = bridge.save_hf_dir(cfg, lora.merge(base, adapters, spec.scale), tmp_path / "merged")
    files = load_file(f"{out}/model.safetensors")  # the safetensors library, not our reader
    hf_state = {name: t.detach().numpy().astype(np.float64) for name, t in model.state_dict().items()}
    hf_names = {"q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
                "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
                "down_proj": "mlp.down_proj"}
    for name, hf in hf_names.items():
        a, b = (np.asarray(adapters["layers"][name][k], np.float64) for k in ("a", "b"))
        for layer in range(cfg.num_layers):
            key = f"model.layers.{layer}.{hf}.weight"
            want = hf_state[key] + 2.0 * (a[layer] @ b[layer]).T  # HF stores [out, in]
            np.testing.assert_allclose(files[key], want, rtol=0, atol=1e-6, err_msg=key)
    np.testing.assert_array_equal(files["model.layers.0.self_attn.q_proj.bias"],
                                  hf_state["model.layers.0.self_attn.q_proj.bias"].astype(np.float32))
    _, loaded = bridge.load_hf_dir(out)
    expected = numpy_merge(base, adapters, spec.scale)
    for name, want in expected.items():
        np.testing.assert_allclose(np.asarray(loaded["layers"][name], np.float64), want, atol=1e-6, err_msg=name)


def test_bad_specs_and_adapters_are_rejected(tiny):
    _, _, base = tiny
    with pytest.raises(ValueError, match=r"LoRA rank=0; valid: an integer >= 1"):
        lora.LoraSpec(rank=0, alpha=1.0)
    with pytest.raises(ValueError, match=r"LoRA alpha=-1.0; valid: a finite number > 0"):
        lora.LoraSpec(rank=1, alpha=-1.0)
    with pytest.raises(ValueError, match=r"LoRA targets=\('q_proj', 'embed'\); valid: .*'gate_proj'"):
        lora.LoraSpec(rank=1, alpha=1.0, targets=("q_proj", "embed"))
    spec = lora.LoraSpec(rank=2, alpha=1.0, targets=("q_proj",))
    adapters = lora.init_adapters(base, spec, jax.random.PRNGKey(0))
    lora.check_adapters(adapters, base)
    wrong = {"layers": {"q_proj": {"a": adapters["layers"]["q_proj"]["a"], "b": jnp.zeros((2, 3, 32))}}}
    with pytest.raises(ValueError, match=r"adapter 'q_proj': A \(2, 32, 2\), B \(2, 3, 32\) do not fit"):
        lora.check_adapters(wrong, base)
    with pytest.raises(ValueError, match=r"adapter 'lm_head' has no base matrix"):
        lora.check_adapters({"layers": {"lm_head": adapters["layers"]["q_proj"]}}, base)
    no_mlp = {**base, "layers": {k: v for k, v in base["layers"].items() if k != "up_proj"}}
    with pytest.raises(ValueError, match=r"LoRA target 'up_proj' is not in params\['layers'\]"):
        lora.init_adapters(no_mlp, lora.LoraSpec(rank=1, alpha=1.0), jax.random.PRNGKey(0))


def test_base_fingerprint_tracks_the_weights(tiny, tmp_path):
    _, cfg, base = tiny
    first = bridge.save_hf_dir(cfg, base, tmp_path / "a")
    same = bridge.save_hf_dir(cfg, base, tmp_path / "b")
    changed = dict(base, final_norm=base["final_norm"].at[0].add(1.0))
    other = bridge.save_hf_dir(cfg, changed, tmp_path / "c")
    assert lora.base_fingerprint(first) == lora.base_fingerprint(same)
    assert lora.base_fingerprint(first) != lora.base_fingerprint(other)
    with pytest.raises(FileNotFoundError, match="holds no \\*.safetensors"):
        lora.base_fingerprint(tmp_path)


def test_grouped_adapters_equal_each_rows_merged_model(tiny):
    """forward(base, lora=GroupedLora) with rows [1, 1] on two adapters of different ranks and targets
    gives each row the logits of its own merged model (W + s A B); the second row's padding is masked."""
    _, cfg, base = tiny
    specs = (lora.LoraSpec(rank=4, alpha=16.0), lora.LoraSpec(rank=2, alpha=4.0, targets=("v_proj", "up_proj")))
    adapters = [random_adapters(base, spec, seed) for seed, spec in ((3, specs[0]), (5, specs[1]))]
    factors = tuple({name: {"a": p["a"], "b": spec.scale * p["b"]} for name, p in a["layers"].items()}
                    for a, spec in zip(adapters, specs))
    grouped, _ = forward(base, cfg, jnp.asarray(TOKENS), attention_mask=jnp.asarray(MASK),
                         lora=lora.GroupedLora(factors, (1, 1)))
    for row, (a, spec) in enumerate(zip(adapters, specs)):
        merged, _ = forward(lora.merge(base, a, spec.scale), cfg, jnp.asarray(TOKENS[row:row + 1]),
                            attention_mask=jnp.asarray(MASK[row:row + 1]))
        real = MASK[row].astype(bool)
        np.testing.assert_allclose(np.asarray(grouped)[row, real], np.asarray(merged)[0, real], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="cover 1 rows; the batch has 2"):
        forward(base, cfg, jnp.asarray(TOKENS), lora=lora.GroupedLora(factors[:1], (1,)))
