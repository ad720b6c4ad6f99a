"""The LLM judge's server and client for a run (`task.judge`): the judge rewards of a task's grader
(rewards/judge.py) are connected here to a judge client (rollout/judge_client.py) over
task.judge.server_urls, or over a vLLM server started for the judge model on 127.0.0.1, stopped with
the run.

The judge never shares the policy's rollout server, even when it is the same model: that server's
weights change every step (the bridge reloads them), so its judgement would move with the policy
being trained. A judge of the same model as the policy is a second server holding the initial weights.
"""
from __future__ import annotations

import contextlib
import logging
import os

from jaxrl_llm.rewards import JudgeReward, WeightedRewards
from jaxrl_llm.train.config import ConfigError
from jaxrl_llm.train.config.judge import JudgeConfig
from jaxrl_llm.train.policy import SOURCE_HELP, resolve_model_dir

log = logging.getLogger(__name__)
SERVED_NAME = "judge"


def judges_of(reward_fn) -> list[JudgeReward]:
    """The judge rewards among a task's graders (itself, or the parts of task.reward_fns)."""
    parts = reward_fn.fns if isinstance(reward_fn, WeightedRewards) else (reward_fn,)
    return [fn for fn in parts if isinstance(fn, JudgeReward)]


def judge_model_dir(judge: JudgeConfig) -> str:
    """The judge's HF directory; ConfigError naming task.judge.model when there is none."""
    try:
        model_dir = resolve_model_dir(judge.model)
    except FileNotFoundError:
        raise ConfigError(f"task.judge.model = {judge.model!r}: no such directory or .gguf file; valid: "
                          f"{SOURCE_HELP}") from None
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise ConfigError(f"task.judge.model = {judge.model!r}: {model_dir} has no config.json; valid: {SOURCE_HELP}")
    return model_dir


def check_judge(judge: JudgeConfig) -> None:
    """Before any model loads: the judge model exists (when the run starts its server)."""
    if judge.enabled and not judge.server_urls:
        judge_model_dir(judge)


def connect_judges(judge: JudgeConfig, reward_fn, *, seed: int, run_path: str, stack: contextlib.ExitStack):
    """Connects the judge rewards of `reward_fn` to a client over task.judge's servers (started here when
    task.judge.server_urls is empty; `stack` stops them); the client, or None when there is no judge."""
    judges = judges_of(reward_fn)
    if not judges:
        return None
    from jaxrl_llm.rollout import VLLMServer, VLLMServerConfig
    from jaxrl_llm.rollout.judge_client import JudgeClient, served_model

    urls = list(judge.server_urls)
    if urls:
        try:
            model = served_model(urls)
        except Exception as err:
            raise ConfigError(f"task.judge.server_urls = {urls!r}: cannot read the served model from /v1/models "
                              f"({err}); valid: URLs of running vLLM servers, or leave it empty to start one") from None
    else:
        log_path = os.path.join(run_path, "judge_server.log")
        log.info("LLM judge: starting a vLLM server for %s (%s) on 127.0.0.1, log %s", judge.model,
                 judge.server_dtype, log_path)
        server = stack.enter_context(VLLMServer(VLLMServerConfig(
            model_dir=judge_model_dir(judge), dtype=judge.server_dtype, max_model_len=judge.max_model_len, seed=seed,
            served_model_name=SERVED_NAME, dev_mode=False, log_path=log_path)))
        urls, model = [server.url], SERVED_NAME
    client = stack.enter_context(JudgeClient(
        urls, model=model, max_tokens=judge.max_tokens, temperature=judge.temperature, seed=seed,
        timeout_s=judge.timeout_s, max_retries=judge.max_retries, max_concurrency=judge.max_concurrency))
    for reward in judges:
        reward.connect(client.complete)
    return client
