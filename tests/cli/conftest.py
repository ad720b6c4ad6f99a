"""Fixtures of the CLI tests."""
import pytest

from tests.train.learning_setup import make_tiny_model_dir


@pytest.fixture(scope="module")
def learning_model_dir(tmp_path_factory) -> str:
    """The tiny model on which a run learns (tests/train/learning_setup.py), once per module."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("learning") / "model")
