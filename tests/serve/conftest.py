"""Fixtures of the Tinker server tests: one tiny random decoder (SmolLM2's tokenizer, tests/train/
tiny_run.py) served on a thread of the pytest process, and the real `tinker` SDK pointed at it.

`tinker_server` is built once per pytest session (tests/serve/ is one process in `make test`) and
shared by the modules, each of which makes its own training clients: the server (its base model
loaded, its programs compiled as the tests go) and the environment the SDK reads (TINKER_API_KEY; TINKER_TELEMETRY=0
so the SDK sends no telemetry; HF_HUB_OFFLINE=1: the tokenizer is the model directory's).
"""
from __future__ import annotations

import os

import pytest

from tests.serve.tinker_setup import API_KEY, sdk_environment
from tests.train.tiny_run import make_plain_tiny_model_dir


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    return make_plain_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tinker_server(tiny_model_dir, tmp_path_factory):
    from jaxrl_llm.serve.tinker.server import build_service, start_in_thread

    service = build_service([tiny_model_dir], str(tmp_path_factory.mktemp("tinker_state")))
    server = start_in_thread(service, api_key=API_KEY)
    saved = {k: os.environ.get(k) for k in sdk_environment(server.url)}
    os.environ.update(sdk_environment(server.url))
    yield server
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def service_client(tinker_server):
    import tinker

    return tinker.ServiceClient(base_url=tinker_server.url)


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(f"{tiny_model_dir}/tokenizer.json")
