"""benchmarks.cpu.op_profile: HLO ops named fwd/bwd with their shapes, and a real trace's op times."""
import tempfile

import jax
import jax.numpy as jnp

from jaxrl_llm.benchmarks.cpu.op_profile import hlo_op_labels, op_seconds


def test_ops_of_a_traced_step_are_timed_and_named():
    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w))

    step = jax.jit(jax.grad(loss))
    w, x = jnp.ones((256, 384)), jnp.ones((128, 256))
    labels = hlo_op_labels(step.lower(w, x).compile().as_text())
    step(w, x).block_until_ready()
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        step(w, x).block_until_ready()
        jax.profiler.stop_trace()
        seconds = op_seconds(trace_dir, steps=1)
    assert seconds and all(value > 0 for value in seconds.values())
    named = [labels[name] for name in seconds if name in labels]
    # the weight gradient x^T @ dy is a backward op with w's shape; the forward x @ w has [128, 384]
    assert any(label.startswith("bwd") and label.endswith("f32[256,384]") for label in named), named
    assert any(label.startswith("fwd") for label in labels.values())


def test_tiny_main_times_the_ops_of_a_two_layer_step(capsys):
    from jaxrl_llm.benchmarks.cpu import op_profile

    out = op_profile.main(["--tiny", "--by-kind"])
    assert (out["cfg"].num_layers, out["cfg"].hidden_size, out["rows"], out["length"]) == (2, 64, 2, 16)
    assert out["seconds"] and all(value > 0 for value in out["seconds"].values())
    printed = capsys.readouterr().out
    assert printed.startswith("2 layers, 2x16 float32, remat off") and "by kind:" in printed
    # the logits of the 15 next tokens of each of the 2 rows over the 512-token vocabulary: a forward op
    assert any(label.startswith("fwd") and label.endswith("f32[2,15,512]") for label in out["labels"].values())
