"""The LLM judge's HTTP client: judge prompts in, the judge model's answers out, from vLLM servers'
OpenAI-compatible `/v1/chat/completions`.

What is sent, per judge prompt (rewards/judge.py fills the rubric):

    {"model": <served name>, "messages": [{"role": "user", "content": <judge prompt>}],
     "n": 1, "max_tokens": M, "temperature": T (default 0: greedy), "top_p": 1, "top_k": 0 (off),
     "seed": S, "add_generation_prompt": true}

The server renders the messages with the judge model's own chat template (the `chat_template` of its
tokenizer_config.json) and a generation prompt; SmolLM2's template puts its default system line
("You are a helpful AI assistant named SmolLM, trained by Hugging Face") before the user message.
Greedy decoding makes a judge prompt's answer reproducible, which is what lets rewards/judge.py
cache it.

`complete` sends the prompts concurrently and returns, per prompt, the answer's text or the exception
that stopped it: `JudgeTimeout` (a `TimeoutError`) when the request ran past `timeout_s` on every
try, the client's error otherwise (a server that refused, was down, answered nonsense). It never
raises for one prompt's failure: the judge scores that answer 0 and counts it.
"""
from __future__ import annotations

import concurrent.futures
from typing import Any, Sequence

import requests

from jaxrl_llm.rollout.vllm_client import VLLMClient, VLLMClientError, VLLMResponseError


class JudgeTimeout(VLLMClientError, TimeoutError):
    """A judge request ran past its timeout."""


def judge_request_body(prompt: str, *, model: str, max_tokens: int, temperature: float,
                       seed: int | None) -> dict[str, Any]:
    """The JSON body of one judge request; every sampling field explicit."""
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "n": 1, "max_tokens": int(max_tokens),
            "temperature": float(temperature), "top_p": 1.0, "top_k": 0, "seed": seed,
            "add_generation_prompt": True}


def served_model(urls: Sequence[str]) -> str:
    """The model name the first server serves (its /v1/models), for servers the run did not start."""
    with VLLMClient(list(urls)) as client:
        cards = client.get("/v1/models", url=client.urls[0]).get("data") or []
    if not cards:
        raise VLLMResponseError(f"{client.urls[0]}/v1/models lists no model")
    return cards[0]["id"]


class JudgeClient:
    """Judge requests over one or more vLLM servers (round-robin), `max_concurrency` at a time.

    Args:
      urls: the servers' base URLs.
      model: the served model name.
      max_tokens, temperature, seed: of every judge request.
      timeout_s: read timeout of one request.
      max_retries: retries of a request that timed out, was refused or got HTTP 5xx.
    """

    def __init__(self, urls: Sequence[str], *, model: str, max_tokens: int, temperature: float = 0.0,
                 seed: int | None = 0, timeout_s: float = 60.0, max_retries: int = 1, max_concurrency: int = 16):
        self.client = VLLMClient(list(urls), model=model, request_timeout_s=timeout_s, max_retries=max_retries,
                                 max_concurrency=1)
        self.body = dict(model=model, max_tokens=max_tokens, temperature=temperature, seed=seed)
        self.timeout_s = float(timeout_s)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_concurrency, thread_name_prefix="judge")

    def answer(self, prompt: str) -> str:
        """The judge's text for one prompt; raises JudgeTimeout or the client's error."""
        try:
            reply = self.client.post("/v1/chat/completions", judge_request_body(prompt, **self.body))
        except VLLMClientError as err:
            if isinstance(err.__cause__, requests.Timeout):
                raise JudgeTimeout(f"no answer within {self.timeout_s:g} s ({err})") from err
            raise
        try:
            return reply["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError) as err:
            raise VLLMResponseError(f"judge answer without choices[0].message.content: {str(reply)[:300]}") from err

    def complete(self, prompts: Sequence[str]) -> list[str | BaseException]:
        """Per prompt, the judge's text or the exception that stopped its request."""
        def one(prompt: str) -> str | BaseException:
            try:
                return self.answer(prompt)
            except VLLMClientError as err:
                return err
        return list(self._pool.map(one, prompts))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()

    def __enter__(self) -> "JudgeClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
