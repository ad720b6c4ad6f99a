"""Choices that depend on the hardware follow the devices compiled for (models/platform.py), and the
libtpu `make venv` installs is the one the `tpu` extra pins."""
from __future__ import annotations

import re
from importlib.metadata import requires
from pathlib import Path

import jax.numpy as jnp

from jaxrl_llm.models.config import tiny_decoder_config
from jaxrl_llm.models.decoder import unroll_layer_loop
from jaxrl_llm.models.fused_attention import use_cudnn_attention
from jaxrl_llm.models.platform import compiling_for, target_platform
from jaxrl_llm.rollout.jax_sampler import decode_path

ROOT = Path(__file__).resolve().parents[2]


def test_choices_follow_the_target_platform():
    cfg = tiny_decoder_config().with_dtypes(param_dtype="bfloat16", compute_dtype="bfloat16")
    assert target_platform() == "cpu"  # the tests' backend
    assert decode_path("auto") == "compact" and unroll_layer_loop(cfg, target_platform(), "off")
    with compiling_for("tpu"):
        assert target_platform() == "tpu"
        assert decode_path("auto") == "slots"
        assert not unroll_layer_loop(cfg, target_platform(), "off")
        assert not use_cudnn_attention(jnp.bfloat16, 64)
    with compiling_for("gpu"):
        assert use_cudnn_attention(jnp.bfloat16, 64)
    assert target_platform() == "cpu"


def test_make_venv_libtpu_is_the_tpu_extras():
    pin = re.search(r"^LIBTPU := libtpu==(\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    jax_pin = next(r for r in requires("jax") if r.startswith("libtpu") and 'extra == "tpu"' in r)
    wanted = re.search(r"libtpu==([\w.*]+)", jax_pin).group(1)
    assert re.fullmatch(wanted.replace(".", r"\.").replace("*", r".*"), pin), (pin, jax_pin)
    extra = re.search(r'^tpu = \["jax\[tpu\]==([\d.]+)"\]', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    import jax

    assert extra == jax.__version__
