"""A server stopped and started again on the same state directory: a client's
create_training_client_from_state_with_optimizer resumes with nothing lost (the next step equals
the step the first server took from the same state, bitwise)."""
from __future__ import annotations

import numpy as np


def _datum(ids):
    from tinker import types

    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})


def _step(client, datum) -> np.ndarray:
    from tinker import types

    client.forward_backward([datum], "cross_entropy").result()
    client.optim_step(types.AdamParams(learning_rate=0.02)).result()
    return client.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()


def test_state_saved_by_one_server_resumes_on_the_next(tiny_model_dir, tinker_server, tmp_path):
    """tinker_server: only for the SDK environment it sets (TINKER_API_KEY, ...); two servers of its own."""
    import tinker

    from jaxrl_llm.serve.tinker.server import build_service, start_in_thread
    from tests.serve.tinker_setup import API_KEY

    datum = _datum(list(range(100, 120)))
    first = start_in_thread(build_service([tiny_model_dir], str(tmp_path)), api_key=API_KEY)
    client = tinker.ServiceClient(base_url=first.url).create_lora_training_client(
        base_model=tiny_model_dir, rank=4, seed=11).result()
    _step(client, datum)
    path = client.save_state("step-1").result().path
    uninterrupted = _step(client, datum)
    first.stop()  # the first server is gone; only its state directory remains

    second = start_in_thread(build_service([tiny_model_dir], str(tmp_path)), api_key=API_KEY)
    try:
        resumed = tinker.ServiceClient(base_url=second.url).create_training_client_from_state_with_optimizer(
            path).result()
        np.testing.assert_array_equal(_step(resumed, datum), uninterrupted)
    finally:
        second.stop()
