"""HTTP client for one or more vLLM servers: token ids in, token ids and
sampler logprobs out.

Requests go to `/v1/completions` with the prompt as a list of token ids, so
nothing is re-tokenised on either side. Each request carries

    "logprobs": 0                     -> the sampled token's logprob only
    "return_token_ids": true          -> choices[i].token_ids as ints
    "return_tokens_as_token_ids": true -> logprobs.tokens as "token_id:N",
                                         cross-checked against token_ids

With the server's `--logprobs-mode processed_logprobs` the logprob is
log mu(token) under the distribution actually sampled from (after
temperature, and after top-k/top-p renormalisation if those are on).

With return_routed_experts, each request also names a fresh key in `vllm_xargs`, and the experts
the server's MoE layers routed each token to are fetched under it afterwards (routed_experts.py).

One request per prompt with `n` samples; requests run concurrently on a
thread pool and go round-robin over the server URLs (a retry moves on to
the next URL). Connection errors, timeouts and 5xx answers are retried with
exponential backoff; 4xx answers are the caller's fault and raised at once.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import threading
import time
import uuid
from typing import Any, Sequence

import numpy as np
import requests

from jaxrl_llm.rollout import routed_experts as routing
from jaxrl_llm.rollout.types import SamplingParams


class VLLMClientError(RuntimeError):
    """Base class of client errors."""


class VLLMRequestError(VLLMClientError):
    """The server rejected the request (HTTP 4xx); retrying would not help."""


class PromptTooLongError(VLLMRequestError, ValueError):
    """A prompt plus max_tokens does not fit the server's max_model_len."""


class VLLMUnavailableError(VLLMClientError):
    """No server answered after all retries (down, dead, or timing out)."""


class VLLMResponseError(VLLMClientError):
    """The server answered with something this client cannot interpret."""


@dataclasses.dataclass(frozen=True)
class CompletionSample:
    """One choice of a /v1/completions answer, parsed."""

    token_ids: np.ndarray  # int32 [L]
    logprobs: np.ndarray  # float32 [L]
    finish_reason: str
    routed_experts: np.ndarray | None = None  # int32 [P + L - 1, layers, top_k] (RolloutRecord.routed_experts)


def completion_request_body(prompt_token_ids: Sequence[int], n: int, params: SamplingParams,
                            model: str, seed: int | None, routing_key: str | None = None) -> dict[str, Any]:
    """The JSON body of a sampling request. Every sampling field is explicit
    so no server-side default can apply silently. A routing_key asks the server to file the
    request's routed experts under it."""
    body = {
        "model": model,
        "prompt": [int(t) for t in prompt_token_ids],
        "n": n,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k is not None else 0,  # vLLM: 0 = off
        "min_p": 0.0,
        "max_tokens": params.max_tokens,
        "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": params.ignore_eos,
        "seed": seed,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        "repetition_penalty": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
    }
    if routing_key is not None:
        body["vllm_xargs"] = {routing.ROUTING_KEY_ARG: routing_key}
    return body


def check_prompt_lengths(prompts: Sequence[Sequence[int]], max_tokens: int, max_model_len: int) -> None:
    """Raise PromptTooLongError naming the first prompt whose length plus
    max_tokens exceeds max_model_len. vLLM itself rejects only a prompt longer
    than max_model_len; a shorter one gets its max_tokens silently cut to what
    is left, and its samples end early with finish_reason "length"."""
    for index, prompt in enumerate(prompts):
        if len(prompt) + max_tokens > max_model_len:
            raise PromptTooLongError(
                f"prompt {index} has {len(prompt)} tokens, and with max_tokens={max_tokens} needs "
                f"{len(prompt) + max_tokens} > the server's max_model_len={max_model_len}. Use prompts of at "
                f"most {max(max_model_len - max_tokens, 0)} tokens, a smaller max_tokens, or start the server "
                "with a larger VLLMServerConfig.max_model_len")


def parse_completion_choice(choice: dict[str, Any]) -> CompletionSample:
    """Token ids and sampled-token logprobs of one choice.

    Raises VLLMResponseError if the fields are missing or disagree (the
    token ids reported in `token_ids` and as "token_id:N" strings must be
    the same sequence, and every position needs a logprob).
    """
    token_ids = choice.get("token_ids")
    logprobs = choice.get("logprobs") or {}
    token_logprobs = logprobs.get("token_logprobs")
    if token_ids is None or token_logprobs is None:
        raise VLLMResponseError(
            "completion choice lacks token_ids or logprobs.token_logprobs; the server must support "
            f"return_token_ids and logprobs (vLLM >= 0.10). Got keys {sorted(choice)}")
    tokens_as_ids = logprobs.get("tokens")
    if tokens_as_ids is not None:
        parsed = [int(t.split(":", 1)[1]) for t in tokens_as_ids]
        if parsed != list(token_ids):
            raise VLLMResponseError(f"token_ids {token_ids} disagree with logprobs.tokens {tokens_as_ids}")
    if len(token_logprobs) != len(token_ids) or any(lp is None for lp in token_logprobs):
        raise VLLMResponseError(f"expected one logprob per token ({len(token_ids)}), got {token_logprobs}")
    return CompletionSample(np.asarray(token_ids, np.int32), np.asarray(token_logprobs, np.float32),
                            choice.get("finish_reason") or "abort")


def parse_prompt_logprobs(prompt_token_ids: Sequence[int], entries: list[Any]) -> np.ndarray:
    """log p(x_t | x_<t) for t = 1..P-1 from vLLM's `prompt_logprobs` list
    (entry 0 is None: the first token has no context)."""
    if entries is None or len(entries) != len(prompt_token_ids):
        raise VLLMResponseError(f"expected {len(prompt_token_ids)} prompt_logprobs entries, got "
                                f"{None if entries is None else len(entries)}")
    out = []
    for token, entry in zip(prompt_token_ids[1:], entries[1:]):
        item = entry.get(str(int(token))) if entry else None
        if item is None:
            raise VLLMResponseError(f"prompt_logprobs entry lacks the prompt token {token}: {entry}")
        out.append(item["logprob"])
    return np.asarray(out, np.float32)


class VLLMClient:
    """Concurrent, retrying client over one or more vLLM server URLs.

    Args:
      urls: base URLs, e.g. ["http://127.0.0.1:8000"].
      model: the served model name (VLLMServerConfig.served_model_name).
      api_key: bearer token, if the servers require one.
      request_timeout_s: read timeout of one HTTP request (a generation
        request must finish within it).
      connect_timeout_s: TCP connect timeout.
      max_retries: retries after the first attempt (connection errors,
        timeouts, HTTP 5xx).
      backoff_s: first retry delay; doubles each retry (0.5, 1, 2, ...).
      max_concurrency: most requests in flight at once.
      max_model_len: the servers' context length, for checking prompt +
        max_tokens before sending; None asks the servers (/v1/models) once.
      return_routed_experts: fill each sample's routed_experts (the servers must run with
        VLLMServerConfig(return_routed_experts=True); otherwise sample raises RoutedExpertsError).
    """

    def __init__(self, urls: Sequence[str] | str, *, model: str = "policy", api_key: str | None = None,
                 request_timeout_s: float = 300.0, connect_timeout_s: float = 5.0, max_retries: int = 3,
                 backoff_s: float = 0.5, max_concurrency: int = 32, max_model_len: int | None = None,
                 return_routed_experts: bool = False):
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise ValueError("urls must name at least one server, got an empty list")
        if max_retries < 0 or backoff_s < 0 or request_timeout_s <= 0 or max_concurrency < 1:
            raise ValueError(f"need max_retries >= 0, backoff_s >= 0, request_timeout_s > 0, "
                             f"max_concurrency >= 1; got {max_retries}, {backoff_s}, "
                             f"{request_timeout_s}, {max_concurrency}")
        self.urls = [u.rstrip("/") for u in urls]
        self.model = model
        self.api_key = api_key
        self.timeout = (connect_timeout_s, request_timeout_s)
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_model_len = max_model_len
        self.return_routed_experts = bool(return_routed_experts)
        self._next_url = itertools.cycle(range(len(self.urls)))
        self._url_lock = threading.Lock()
        self._local = threading.local()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_concurrency, thread_name_prefix="vllm-client")

    # -- plumbing -----------------------------------------------------------

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:  # requests.Session is not thread-safe: one per thread
            session = self._local.session = requests.Session()
            if self.api_key:
                session.headers["Authorization"] = f"Bearer {self.api_key}"
        return session

    def _pick_url(self) -> str:
        with self._url_lock:
            return self.urls[next(self._next_url)]

    def post(self, path: str, body: dict[str, Any] | None = None, *, url: str | None = None,
             timeout_s: float | None = None) -> Any:
        """POST with retries; returns the decoded JSON (or None for an empty body).

        With url=None each attempt takes the next server round-robin; with a
        url every attempt goes to that server.
        """
        timeout = self.timeout if timeout_s is None else (self.timeout[0], timeout_s)
        attempts = self.max_retries + 1
        last_error: Exception | None = None
        tried: list[str] = []
        started = time.monotonic()
        for attempt in range(attempts):
            target = url or self._pick_url()
            tried.append(target)
            try:
                response = self._session().post(target + path, json=body, timeout=timeout)
            except requests.RequestException as err:  # refused, reset, timed out
                last_error = err
            else:
                if response.status_code < 400:
                    return response.json() if response.content else None
                if response.status_code < 500:
                    raise VLLMRequestError(f"{target}{path} rejected the request with HTTP "
                                           f"{response.status_code}: {response.text[:2000]}")
                last_error = VLLMClientError(f"HTTP {response.status_code}: {response.text[:500]}")
            if attempt + 1 < attempts:
                time.sleep(self.backoff_s * 2 ** attempt)
        raise VLLMUnavailableError(
            f"POST {path} failed {attempts} times over {time.monotonic() - started:.1f} s "
            f"(servers tried: {sorted(set(tried))}); last error: {last_error!r}") from last_error

    def post_all(self, path: str, body: dict[str, Any] | None = None,
                 timeout_s: float | None = None) -> list[Any]:
        """The same POST to every server (weight reloads, cache resets)."""
        futures = [self._pool.submit(self.post, path, body, url=u, timeout_s=timeout_s) for u in self.urls]
        return [f.result() for f in futures]

    def get(self, path: str, *, url: str) -> Any:
        response = self._session().get(url + path, timeout=self.timeout)
        if response.status_code >= 400:
            raise VLLMRequestError(f"GET {url}{path} -> HTTP {response.status_code}: {response.text[:500]}")
        return response.json() if response.content else None

    def health(self) -> list[bool]:
        """Whether each server answers /health with 200 right now."""
        def ok(url: str) -> bool:
            try:
                return self._session().get(url + "/health", timeout=self.timeout[0]).status_code == 200
            except requests.RequestException:
                return False
        return [ok(u) for u in self.urls]

    def server_max_model_len(self) -> int | None:
        """The smallest max_model_len the servers report for this model on
        /v1/models (remembered once known); None when no server answers."""
        if self.max_model_len is None:
            reported = []
            for url in self.urls:
                try:
                    cards = self.get("/v1/models", url=url)["data"]
                except (requests.RequestException, VLLMClientError, KeyError, TypeError):
                    continue  # down or not a vLLM server: the request itself will say so
                reported += [c["max_model_len"] for c in cards if c.get("id") == self.model and
                             isinstance(c.get("max_model_len"), int)]
            self.max_model_len = min(reported) if reported else None
        return self.max_model_len

    # -- sampling -----------------------------------------------------------

    def sample(self, prompts_token_ids: Sequence[Sequence[int]], n: int,
               params: SamplingParams) -> list[list[CompletionSample]]:
        """n samples for each prompt; result[p][j] is sample j of prompt p.

        With params.seed = s, prompt p is sent with seed s + first_row + p * n and
        vLLM gives its j-th child seed s + first_row + p * n + j, so every sample
        of the batch has its own seed, the batch is reproducible, and a batch
        split over calls (params.first_row) gets the seeds of one call.
        """
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n (samples per prompt) must be an int >= 1, got {n!r}")
        prompts = [list(map(int, p)) for p in prompts_token_ids]
        for index, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError(f"prompt {index} is empty; every prompt needs at least one token id")
        max_model_len = self.server_max_model_len()
        if max_model_len is not None:
            check_prompt_lengths(prompts, params.max_tokens, max_model_len)
        if self.return_routed_experts:
            self.install_routing_capture()

        def one(index: int) -> list[CompletionSample]:
            seed = None if params.seed is None else int(params.seed) + params.first_row + index * n
            key = uuid.uuid4().hex if self.return_routed_experts else None
            body = completion_request_body(prompts[index], n, params, self.model, seed, routing_key=key)
            answer = self.post("/v1/completions", body)
            choices = sorted(answer["choices"], key=lambda c: c["index"])
            if len(choices) != n:
                raise VLLMResponseError(f"asked for n={n} samples of prompt {index}, got {len(choices)}")
            samples = [parse_completion_choice(c) for c in choices]
            return samples if key is None else self._with_routed_experts(key, len(prompts[index]), samples, index)

        return list(self._pool.map(one, range(len(prompts))))

    def install_routing_capture(self) -> list[dict]:
        """Hook the routers of every server (idempotent; once per batch, so a weight reload cannot
        unhook them): per worker {"num_layers", "top_k", "moe_layers"}. Raises RoutedExpertsError,
        naming the option, when a server does not record routed experts."""
        body = {"method": routing.INSTALL_METHOD}
        try:
            answers = self.post_all("/collective_rpc", body)
        except VLLMClientError as err:
            raise routing.RoutedExpertsError(
                f"{routing.OPTION}=True, but a server does not record routed experts ({routing.HOW_TO_START}); "
                f"its /collective_rpc {routing.INSTALL_METHOD} failed: {str(err)[:300]}") from err
        return routing.worker_results(answers, self.urls, routing.INSTALL_METHOD)

    def _with_routed_experts(self, key: str, prompt_len: int, samples: list[CompletionSample],
                             prompt_index: int) -> list[CompletionSample]:
        # One server after the other from this (pool) thread: post_all would queue on the pool
        # this runs in, and a full pool would wait on itself.
        body = {"method": routing.TAKE_METHOD, "args": [key]}
        answers = [self.post("/collective_rpc", body, url=url) for url in self.urls]
        taken = routing.merge_taken(routing.worker_results(answers, self.urls, routing.TAKE_METHOD))
        return [dataclasses.replace(s, routed_experts=routing.decode_routed_experts(
                    taken.get(j), prompt_len, len(s.token_ids), f"sample {j} of prompt {prompt_index}"))
                for j, s in enumerate(samples)]

    def prompt_logprobs(self, token_ids: Sequence[int], *, url: str | None = None) -> np.ndarray:
        """float32 [P-1]: log p(x_t | x_<t) of a fixed sequence, scored by the
        server's current weights at temperature 1 (prompt logprobs are never
        temperature-processed)."""
        token_ids = [int(t) for t in token_ids]
        if len(token_ids) < 2:
            raise ValueError(f"need at least 2 tokens to score, got {len(token_ids)}")
        body = {"model": self.model, "prompt": token_ids, "max_tokens": 1, "temperature": 1.0,
                "prompt_logprobs": 0, "return_token_ids": True}
        answer = self.post("/v1/completions", body, url=url)
        return parse_prompt_logprobs(token_ids, answer["choices"][0].get("prompt_logprobs"))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> "VLLMClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
