"""Fixtures shared by the train tests (pytest finds them here; no test module imports another):

- tiny_model_dir: a random 2-layer decoder with SmolLM2's tokenizer (tests/train/tiny_run.py);
- stopping_model_dir: the same, built to end its answers after ~4 tokens (tiny_run.py);
- learning_model_dir / learning_policy: the tiny model on which a run learns within a few
  steps (tests/train/learning_setup.py).

The kill-and-resume helpers are plain functions in tests/train/kill_resume.py, the reference
and teacher tests' learner setup in tests/train/reference_setup.py. Each fixture
is built once per test module, as when each module defined its own."""
import pytest

from tests.train.learning_setup import make_tiny_model_dir
from tests.train.tiny_run import make_plain_tiny_model_dir, make_stopping_model_dir


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> str:
    return make_plain_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def stopping_model_dir(tmp_path_factory) -> str:
    return make_stopping_model_dir(tmp_path_factory.mktemp("stopping") / "model")


@pytest.fixture(scope="module")
def learning_model_dir(tmp_path_factory) -> str:
    return make_tiny_model_dir(tmp_path_factory.mktemp("learning") / "model")


@pytest.fixture(scope="module")
def learning_policy(learning_model_dir):
    from jaxrl_llm.train.policy import load_policy

    return load_policy(learning_model_dir)
