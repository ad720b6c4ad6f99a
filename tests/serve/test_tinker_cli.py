"""`jaxrl serve-tinker` as a user runs it: refused setups are one line, exit status 2 (before any
model is loaded); a real server process killed with SIGKILL mid-run and started again lets a
client resume from its saved state (slow)."""
from __future__ import annotations

import os
import signal
import time

import httpx
import numpy as np
import pytest

from tests.one_line_errors import finish, jaxrl, one_line_error, start_jaxrl, without


def test_refused_setups_are_one_line_errors(tiny_model_dir):
    no_key = jaxrl("serve-tinker", "--base-model", tiny_model_dir, env={"JAXRL_TINKER_API_KEY": ""})
    one_line_error(no_key, ["no API key", "$JAXRL_TINKER_API_KEY", "--dev"])
    open_dev = jaxrl("serve-tinker", "--base-model", tiny_model_dir, "--dev", "--host", "0.0.0.0")
    one_line_error(open_dev, ["'0.0.0.0'", "loopback"])
    bad_key = jaxrl("serve-tinker", "--base-model", tiny_model_dir, env={"JAXRL_TINKER_API_KEY": "secret"})
    one_line_error(bad_key, ["must start with 'tml-'"])
    no_sdk = finish(start_jaxrl("serve-tinker", "--base-model", tiny_model_dir, "--dev", entry=without("tinker")))
    one_line_error(no_sdk, ["pip install -e '.[tinker]'"])


def _serve(model_dir: str, state_dir, port: int):
    from tests.serve.tinker_setup import API_KEY

    proc = start_jaxrl("serve-tinker", "--base-model", model_dir, "--state-dir", str(state_dir), "--port", str(port),
                       env={"JAXRL_TINKER_API_KEY": API_KEY})
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/v1/healthz", timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise AssertionError(f"jaxrl serve-tinker did not answer /healthz within 240 s: {proc.communicate()}")


def _stop(proc) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=60)


@pytest.mark.slow
def test_a_server_killed_mid_run_resumes_from_its_saved_state(tiny_model_dir, tinker_server, tmp_path):
    """tinker_server: only for the SDK environment it sets; the servers here are `jaxrl serve-tinker` processes."""
    import tinker
    from tinker import types

    from jaxrl_llm.serve.tinker.server import free_port

    ids = list(range(200, 230))
    datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})

    def step(client):
        client.forward_backward([datum], "cross_entropy").result()
        client.optim_step(types.AdamParams(learning_rate=0.02)).result()
        return client.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()

    port = free_port()
    first = _serve(tiny_model_dir, tmp_path, port)
    try:
        client = tinker.ServiceClient(base_url=f"http://127.0.0.1:{port}").create_lora_training_client(
            base_model=tiny_model_dir, rank=4, seed=3).result()
        step(client)
        path = client.save_state("step-1").result().path
        uninterrupted = step(client)
        client.forward_backward([datum], "cross_entropy")  # in flight when the server dies
        os.kill(first.pid, signal.SIGKILL)
        assert first.wait(timeout=30) == -signal.SIGKILL
    finally:
        _stop(first)

    port = free_port()
    second = _serve(tiny_model_dir, tmp_path, port)
    try:
        resumed = tinker.ServiceClient(base_url=f"http://127.0.0.1:{port}").create_training_client_from_state_with_optimizer(
            path).result()
        np.testing.assert_array_equal(step(resumed), uninterrupted)
    finally:
        _stop(second)
