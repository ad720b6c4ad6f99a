"""Fixtures of the environment-adapter tests: a random 2-layer decoder over SmolLM2's real
tokenizer and chat template (tests/train/tiny_run.py), built once per module, and its policy."""
import pytest

from tests.train.tiny_run import make_plain_tiny_model_dir


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> str:
    return make_plain_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    from jaxrl_llm.train.policy import load_policy

    return load_policy(tiny_model_dir)
