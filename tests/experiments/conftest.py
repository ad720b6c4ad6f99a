"""Fixtures of the experiments tests."""
import pytest

from tests.train.tiny_run import make_plain_tiny_model_dir


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> str:
    """A random 2-layer decoder with SmolLM2's tokenizer (tests/train/tiny_run.py)."""
    return make_plain_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model")
