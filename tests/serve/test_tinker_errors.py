"""Bad inputs through the real SDK: each answers in the SDK's error shape ({"error", "category"};
the SDK raises with the message), names what is wrong and what is valid, and leaves the server
serving (a good call after each works)."""
from __future__ import annotations

import httpx
import pytest

from tests.serve.tinker_setup import API_KEY


@pytest.fixture(scope="module")
def trainer(service_client, tiny_model_dir):
    return service_client.create_lora_training_client(base_model=tiny_model_dir, rank=2, seed=0).result()


def _datum(tokens, **inputs):
    from tinker import types

    return types.Datum(model_input=types.ModelInput.from_ints(tokens), loss_fn_inputs=inputs)


def _still_serving(trainer) -> None:
    out = trainer.forward([_datum([1, 2, 3], target_tokens=[2, 3, 4], weights=[1.0, 1.0, 1.0])],
                          "cross_entropy").result()
    assert out.metrics["loss:sum"] > 0


def test_bad_training_calls_answer_in_the_sdks_shape(service_client, trainer, tiny_model_dir):
    import tinker

    with pytest.raises(tinker.RequestFailedError, match=r"base_model='no/such-model' is not served here; valid: \["):
        service_client.create_lora_training_client(base_model="no/such-model", rank=2).result()
    with pytest.raises(tinker.RequestFailedError, match=r"lora_config.rank=0; valid: an integer >= 1"):
        service_client.create_lora_training_client(base_model=tiny_model_dir, rank=0).result()
    with pytest.raises(tinker.RequestFailedError, match=r"loss_fn='dro' is not supported .*valid: \['cispo'"):
        trainer.forward_backward([_datum([1, 2], target_tokens=[2, 3], logprobs=[0.0, 0.0], advantages=[1.0, 1.0])],
                                 "dro").result()
    with pytest.raises(tinker.RequestFailedError, match=r"datum 0: loss_fn_inputs\['weights'\] has shape \[2\]; "
                                                        r"valid: \[3\]"):
        trainer.forward_backward([_datum([1, 2, 3], target_tokens=[2, 3, 4], weights=[1.0, 1.0])],
                                 "cross_entropy").result()
    with pytest.raises(tinker.RequestFailedError, match=r"datum 0: target_tokens holds token id 49152; valid: 0 to 49151"):
        trainer.forward([_datum([1], target_tokens=[49152], weights=[1.0])], "cross_entropy").result()
    with pytest.raises(tinker.RequestFailedError, match=r"missing \['advantages', 'logprobs'\]"):
        trainer.forward([_datum([1], target_tokens=[2], weights=[1.0])], "ppo").result()
    _still_serving(trainer)


def test_sampling_before_any_weights_were_saved(service_client, trainer):
    import tinker

    with pytest.raises(tinker.APIStatusError, match=r"no checkpoint at tinker://nobody/sampler_weights/none"):
        service_client.create_sampling_client(model_path="tinker://nobody/sampler_weights/none").result()
    with pytest.raises(tinker.RequestFailedError, match=r"no checkpoint at tinker://.*/weights/never-saved"):
        trainer.load_state(f"tinker://{trainer.model_id}/weights/never-saved").result()
    _still_serving(trainer)


def test_unsupported_calls_and_wrong_keys(tinker_server, trainer):
    url = tinker_server.url
    headers = {"X-API-Key": API_KEY}
    copy = httpx.post(f"{url}/api/v1/copy_weights", json={"path": "tinker://x/weights/y"}, headers=headers)
    assert copy.status_code == 404 and copy.headers["x-should-retry"] == "false"
    assert copy.json()["category"] == "user"
    assert copy.json()["error"].startswith("copy_weights: POST /api/v1/copy_weights is not supported")
    wrong = httpx.post(f"{url}/api/v1/create_session", json={"tags": [], "sdk_version": "0.38.0"},
                       headers={"X-API-Key": "tml-wrong"})
    assert wrong.status_code == 401 and "X-API-Key" in wrong.json()["error"]
    session = httpx.post(f"{url}/api/v1/create_session", json={"tags": [], "sdk_version": "0.38.0"}, headers=headers)
    beat = httpx.post(f"{url}/api/v1/session_heartbeat", json={"session_id": session.json()["session_id"]},
                      headers=headers)
    assert beat.json() == {"type": "session_heartbeat"}
    _still_serving(trainer)
