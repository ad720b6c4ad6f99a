"""`jaxrl compile` on tiny configs: every program of an RL step compiles for v5e:2x2 (v5e-4) and
v5p:2x2x1 (v5p-8) from shapes, and a planted too-large config is refused in one line, exit 2."""
from __future__ import annotations

import pytest

from jaxrl_llm import cli
from jaxrl_llm.benchmarks.tpu.analysis import oom_bytes
from jaxrl_llm.benchmarks.tpu.chips import GIB, parse_slice
from jaxrl_llm.benchmarks.tpu.compile_step import compile_step
from jaxrl_llm.models.config import tiny_decoder_config
from jaxrl_llm.train.config.schema import Config, apply_overrides

TINY_STEP = ["rollout.prompts_per_step=4", "rollout.samples_per_prompt=2", "rollout.max_tokens=16",
             "train.precision=bf16", "train.micro_batch_size=4", "train.remat=full", "recipe.kl_beta=0.01"]
PROGRAMS = ["learner_update", "pi_old", "sampler_prefill", "sampler_decode_step", "weight_handoff"]


@pytest.mark.parametrize("topology, kind", [("v5e-4", "v5e"), ("v5p-8", "v5p")])
def test_tiny_step_compiles_for_tpu(topology, kind):
    cfg = apply_overrides(Config(), TINY_STEP)
    model_cfg = tiny_decoder_config(vocab_size=1024, num_layers=2)
    result = compile_step(cfg, topology, model_cfg=model_cfg, prompt_len=16, log=lambda _: None)
    assert result["chips"] == 4 and result["chip"] == kind and result["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
    rows = {row["program"]: row for row in result["programs"]}
    assert list(rows) == PROGRAMS
    assert result["fits"] and result["step_estimate"]["seconds"] > 0
    # the decode step by hand, per chip: slots split over 4 chips, 2 x rows x (projections + LM head)
    decode = rows["sampler_decode_step"]
    c = model_cfg
    layer = c.hidden_size * c.head_dim * (c.num_heads + 2 * c.num_kv_heads) + c.num_heads * c.head_dim * c.hidden_size \
        + 3 * c.hidden_size * c.intermediate_size
    attention = 2 * 2 * decode["cache_slots"] * c.num_heads * c.head_dim
    hand = (8 // 4) * (c.num_layers * (2 * layer + attention) + 2 * c.hidden_size * c.vocab_size)
    assert decode["decode_steps"] == 16  # rollout.max_tokens steps in one loop, counted through it
    assert decode["flops"] == 16 * hand
    # the master weights and Adam's two moments (float32) are arguments, split over the 4 chips
    assert rows["learner_update"]["argument_bytes"] >= 3 * 4 * result["params"] / 4
    assert rows["pi_old"]["reference"] and all(row["fits"] for row in rows.values())
    # the hand-off writes the bf16 weights in the sampler's layout: FSDP-split over the 4 chips, not
    # a whole copy per chip (TPU memory pads small arrays to (8, 128) tiles, so not exactly a quarter)
    bf16_weights = 2 * result["params"]
    assert bf16_weights / 4 <= rows["weight_handoff"]["output_bytes"] < bf16_weights


def test_too_large_config_is_refused_in_one_line(capsys):
    """Qwen2.5-32B's first 6 layers with AdamW need ~26 GiB per chip of a v5e-4 (16 GiB): exit 2,
    one line naming the program, the chip's HBM and the bytes needed."""
    code = cli.main(["compile", "--config", "experiments/demo.py", "--topology", "v5e-4", "--model", "qwen2.5-32b",
                     "--num-layers", "6", "--prompt-len", "16", *TINY_STEP])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == cli.USAGE_ERROR
    assert len(err) == 1, err
    assert err[0].startswith("jaxrl compile: error: learner_update does not fit v5e-4: it needs ")
    needed = float(err[0].split("it needs ")[1].split(" GiB")[0]) * GIB
    assert "a v5e chip has 16.00 GiB of HBM" in err[0]
    # by hand: float32 weights + two Adam moments + float32 gradients, split over 4 chips
    params = 151936 * 5120 * 2 + 6 * (5120 * 128 * (40 + 16) + 40 * 128 * 5120 + 3 * 5120 * 27648)
    assert needed >= 4 * 4 * params / 4 * 0.9


def test_unknown_topology_and_xla_oom_text():
    with pytest.raises(ValueError, match="valid: v4-8"):
        parse_slice("v5e-3")
    assert oom_bytes("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 20.50G of 15.75G hbm.") \
        == 20.5 * GIB


def test_missing_libtpu_says_how_to_install(monkeypatch, capsys):
    from jaxrl_llm.benchmarks.tpu import chips

    monkeypatch.setattr(chips, "libtpu_path", lambda: None)
    code = cli.main(["compile", "--config", "experiments/demo.py", "--topology", "v5e-4", "--model", "qwen2.5-1.5b"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == cli.USAGE_ERROR and len(err) == 1
    assert "libtpu" in err[0] and "make venv" in err[0]


def test_sampler_mesh_layout_gathers_no_layer_weight():
    """rollout.mesh (data 2 x tensor 2, heads split with their 2 KV heads): the decode step reads its own
    shards of every layer's weights;
    its one all-gather is the tied [V, D] embedding for the LM head (XLA's choice on TPU when the logits
    are constrained to whole rows: 1024 x 32 bf16 = 65536 bytes). In the learner's FSDP layout the same
    step all-gathers the layers' weights too."""
    model_cfg = tiny_decoder_config(vocab_size=1024, num_layers=2)
    rows = {}
    for name, extra in (("learner", []), ("sampler", ["rollout.mesh.data=2", "rollout.mesh.tensor=2"])):
        cfg = apply_overrides(Config(), TINY_STEP + extra)
        result = compile_step(cfg, "v5e-4", model_cfg=model_cfg, prompt_len=16, log=lambda _: None)
        rows[name] = {row["program"]: row for row in result["programs"]}
    assert rows["sampler"]["sampler_decode_step"]["sampler_layout"] == "rollout.mesh data 2 x tensor 2"
    embed = 2 * model_cfg.vocab_size * model_cfg.hidden_size
    gathers = {name: r["sampler_decode_step"]["collectives"].get("all-gather", {}).get("bytes", 0.0)
               for name, r in rows.items()}
    assert gathers["sampler"] <= embed
    assert gathers["learner"] > embed


def test_fp16_is_refused_for_tpu_with_xla_reason(capsys, monkeypatch):
    """fp16 (the Precision-RL recipe) has f16 x f16 -> f32 dots, which XLA's TPU compiler does not
    implement: refused in one line naming the program and XLA's reason, exit 2."""
    from jaxrl_llm.benchmarks.tpu import compile_step as compile_module

    monkeypatch.setattr(compile_module, "policy_config", lambda *_: tiny_decoder_config(vocab_size=1024, num_layers=1))
    code = cli.main(["compile", "--config", "experiments/demo.py", "--topology", "v5e-4", "--prompt-len", "16",
                     *TINY_STEP, "train.precision=fp16"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == cli.USAGE_ERROR and len(err) == 1, err
    assert err[0].startswith("jaxrl compile: error: learner_update cannot be compiled for v5e-4: ")
    assert "UNIMPLEMENTED" in err[0] and "F16" in err[0]
