"""verifiers' environments as multi-turn tasks: ``task.name=verifiers`` with ``task.kwargs.env_id``.

verifiers (prime-rl's environment library, PyPI ``verifiers``, the optional ``verifiers``
extra, pinned to 0.3.1) writes an environment as a data set of chat prompts, a rollout
protocol (``SingleTurnEnv``, ``MultiTurnEnv.env_response``, ``ToolEnv`` with Python
functions as tools, stop conditions) and a ``Rubric`` of weighted reward functions. Any such
environment runs, unchanged, through the project's multi-turn loop (train/sample/episodes.py)
on either engine::

    task.kwargs='{"env_id": "my_envs.arith:load_environment", "env_args": {"n": 50}}'  # a module you bring
    task.kwargs='{"env_id": "vf-reverse-text"}'          # an installed environment package (its load_environment)

Version: 0.3.1 is the last release with the classic ("legacy", v0) API, whose rollout
calls an in-process ``vf.Client``. 0.4.0 ships only ``verifiers.v1``, which talks to the
model over HTTP and runs the model-facing program through ``runtime.prepare_uv_script``
(uv, fetched on demand): neither works offline, and an HTTP endpoint would add a server and
a tokenize/detokenize round trip per turn for nothing (docs/environments.md).

How an episode runs: verifiers' own ``rollout`` (final in ``MultiTurnEnv``: setup_state,
stop conditions, env_response, cleanup) runs as a coroutine on the episode's own event loop,
with :class:`LoopClient` as its client. When the rollout asks the client for a model turn,
the coroutine waits and the episode hands the request's new messages to the project's loop as
the observation (the first: the data set's prompt, system prompt and few-shot turns included;
later: the env's messages, e.g. tool results); the loop samples all running episodes' turns in
one engine call and ``step(text)`` resolves the request with the policy's text. When the
rollout ends, the rubric scores it (``Rubric.score_rollout``) and that is the episode's reward
(earlier steps give 0). The loop appends the sampler's ids and the chat-template ids of each
observation turn by turn: the history is never re-tokenized, and verifiers sees text only.

Tools: the environment's tool schemas go into the first system message in the Hermes format
(``<tools>`` JSON schemas; calls written as ``<tool_call>{"name": ..., "arguments": ...}
</tool_call>``), the format of Qwen2.5/Qwen3's chat templates and of vLLM's ``hermes`` tool
parser; :func:`parse_tool_calls` reads the policy's calls back into verifiers' ``ToolCall``.
The tools are the environment's own Python functions, called by verifiers in the trainer's
process, as in any verifiers run.

Refused, with one line: an id that is neither an importable ``module:function`` nor an
installed environment package; env arguments the loader does not take; a rubric with group
reward functions (the loop scores episodes one by one); the verifiers package missing.
"""
from __future__ import annotations

import asyncio
import difflib
import importlib.util
import inspect
import json
import random
import re
import time
from typing import Any, Mapping

from jaxrl_llm.data.environments import EnvTask, StepResult
from jaxrl_llm.data.plugins import PluginError, load_object
from jaxrl_llm.data.records import HELDOUT, TRAIN, Example, check_heldout_fraction, split_of
from jaxrl_llm.data.task_base import DEFAULT_HELDOUT_FRACTION

VERSION = "0.3.1"
INSTALL = f"pip install -e '.[verifiers]' (verifiers=={VERSION})"
MODEL_NAME = "jaxrl-policy"  # the model name verifiers' state records; the project's engine samples
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class VerifiersEnvError(ValueError):
    """A verifiers environment that cannot run here: unknown id, bad arguments, group rewards."""


def import_verifiers():
    """``verifiers.legacy`` (the v0 API); ImportError naming what to install if it is missing or too new."""
    try:
        import verifiers
    except ImportError as err:
        raise ImportError(f"task.name = 'verifiers' needs the verifiers package, which cannot be imported ({err}); "
                          f"install it with: {INSTALL}") from None
    if importlib.util.find_spec("verifiers.legacy") is None:
        raise ImportError(f"task.name = 'verifiers' needs verifiers' classic API (verifiers.legacy), which verifiers "
                          f"{getattr(verifiers, '__version__', '?')} lacks; install: {INSTALL}")
    import verifiers.legacy as vf
    import verifiers.legacy.clients  # noqa: F401  (vf.Client)
    return vf


def resolve_loader(env_id: Any):
    """The function that builds the environment: ``"module:function"`` (a module on sys.path),
    else the ``load_environment`` of the installed package named by ``env_id`` (verifiers' rule:
    ``"vf-reverse-text"`` and ``"owner/vf-reverse-text"`` are module ``vf_reverse_text``)."""
    if isinstance(env_id, str) and _SPEC.match(env_id):
        try:
            return load_object(env_id, what="task.kwargs.env_id")
        except PluginError as err:
            raise VerifiersEnvError(str(err)) from None
    module = env_id.replace("-", "_").split("/")[-1] if isinstance(env_id, str) else ""
    if not module.isidentifier() or importlib.util.find_spec(module) is None:
        raise VerifiersEnvError(
            f"task.kwargs.env_id = {env_id!r} is not a verifiers environment: no module {module!r} is installed; "
            "valid: 'package.module:function' (a function returning a verifiers Environment, on sys.path) or the "
            "id of an installed environment package (its module has load_environment)")
    loader = getattr(importlib.import_module(module), "load_environment", None)
    if not callable(loader):
        raise VerifiersEnvError(f"task.kwargs.env_id = {env_id!r}: module {module!r} has no load_environment(); "
                                "valid: an environment package's id, or 'package.module:function'")
    return loader


def check_env_args(env_id: str, loader, env_args: Any) -> dict:
    """``env_args`` as a dict the loader accepts (VerifiersEnvError naming the bad key and the valid ones)."""
    if not isinstance(env_args, Mapping):
        raise VerifiersEnvError(f"task.kwargs.env_args = {env_args!r}: expected a mapping of the arguments of "
                                f"{env_id!r}'s loader")
    params = inspect.signature(loader).parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return dict(env_args)
    named = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = sorted(set(env_args) - set(named))
    if unknown:
        close = difflib.get_close_matches(unknown[0], named, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise VerifiersEnvError(f"task.kwargs.env_args {', '.join(map(repr, unknown))}: not an argument of "
                                f"{env_id!r}'s loader{hint}; valid: {', '.join(named) or 'none'}")
    return dict(env_args)


def tool_system_text(tool_defs) -> str:
    """The Hermes-format tool prompt (Qwen2.5's chat template words it the same way)."""
    schemas = "\n".join(json.dumps({"type": "function", "function": {"name": t.name, "description": t.description,
                                                                     "parameters": t.parameters}})
                        for t in tool_defs)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
            f"function signatures within <tools></tools> XML tags:\n<tools>\n{schemas}\n</tools>\n\nFor each function "
            "call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


class ParsedTurn:
    """The policy's text as an assistant message: the text outside tool-call blocks, and the calls."""

    def __init__(self, content: str, calls: list[tuple[str, str]]):
        self.content, self.calls = content, calls  # calls: (name, arguments as a JSON string)


def parse_tool_calls(text: str) -> ParsedTurn:
    """Hermes-format calls: each ``<tool_call>{"name": str, "arguments": {...}}</tool_call>`` block
    that parses becomes a call and leaves the content; a block that does not parse stays in the
    content as text (as vLLM's hermes parser leaves it)."""
    calls, kept = [], []
    last = 0
    for match in TOOL_CALL.finditer(text):
        try:
            call = json.loads(match.group(1))
            name, arguments = call["name"], call.get("arguments", {})
            if not isinstance(name, str):
                raise TypeError(name)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        kept.append(text[last:match.start()])
        last = match.end()
        calls.append((name, arguments if isinstance(arguments, str) else json.dumps(arguments)))
    kept.append(text[last:])
    return ParsedTurn("".join(kept), calls)  # not stripped: the rubric reads the text as sampled


def chat_messages(messages) -> list[dict]:
    """verifiers messages (pydantic) as the chat template's dicts: role and text content."""
    out = []
    for m in messages:
        content = m.content
        if isinstance(content, list):  # content parts: the text ones (an image cannot reach a text policy)
            content = "".join(getattr(p, "text", "") or "" for p in content)
        out.append({"role": "user" if m.role == "text" else m.role, "content": content or ""})
    return out


def make_loop_client(vf):
    """:class:`LoopClient`, a ``vf.Client`` subclass (built lazily: verifiers is optional)."""

    class LoopClient(vf.Client):
        """The rollout's client: a model turn is a request the episode's owner answers with
        ``answer(text)``; until then the rollout coroutine waits."""

        def __init__(self):
            super().__init__(None)
            self.request: tuple[list, Any] | None = None  # (prompt messages, tool defs) of the pending turn
            self.pending: asyncio.Future | None = None
            self.turns = 0

        def setup_client(self, config):  # never called: the client is built in process
            raise NotImplementedError

        async def to_native_tool(self, tool):
            return tool

        async def to_native_prompt(self, messages):
            return list(messages), {}

        async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
            self.request = (prompt, tools)
            self.pending = asyncio.get_running_loop().create_future()
            text = await self.pending
            self.request = self.pending = None
            self.turns += 1
            turn = parse_tool_calls(text)
            calls = [vf.ToolCall(id=f"call_{self.turns}_{i}", name=n, arguments=a) for i, (n, a) in
                     enumerate(turn.calls)] or None
            message = vf.ResponseMessage(content=turn.content, tool_calls=calls, is_truncated=False,
                                         finish_reason="tool_calls" if calls else "stop")
            return vf.Response(id=f"turn-{self.turns}", created=int(time.time()), model=model, message=message)

        async def raise_from_native_response(self, response):
            return None

        async def from_native_response(self, response):
            return response

        async def close(self):
            return None

    return LoopClient


class VerifiersEpisode:
    """One episode (:class:`~jaxrl_llm.data.environments.Environment`): verifiers' rollout of one
    data set row on its own event loop, paused at each model turn (see the module docstring)."""

    def __init__(self, task: "VerifiersTask"):
        self.task = task
        self.loop: asyncio.AbstractEventLoop | None = None
        self.client = None
        self.rollout: asyncio.Task | None = None
        self.shown = 0  # messages of the rollout's prompt already in the policy's history
        self.state = None

    def reset(self, example: Example) -> tuple[list[dict], dict]:
        row = self.task.row(example)
        self.loop = asyncio.new_event_loop()
        self.client = self.task.client_class()
        self.rollout = self.loop.create_task(self.task.score(row, self.client))
        messages = self._advance()
        if messages is None:
            raise VerifiersEnvError(f"verifiers environment {self.task.env_id!r} ended its rollout before the first "
                                    f"model turn (stop condition {self.state.get('stop_condition')!r}, error "
                                    f"{self.state.get('error')!r})")
        tools = self.client.request[1]
        if tools:  # the tool schemas, in the system message (the first one, or a new one)
            text = tool_system_text(tools)
            if messages and messages[0]["role"] == "system":
                messages[0] = {"role": "system", "content": f"{messages[0]['content']}\n\n{text}"}
            else:
                messages.insert(0, {"role": "system", "content": text})
        return messages, {"example_id": row.get("example_id")}

    def step(self, action_text: str) -> StepResult:
        if self.client is None or self.client.pending is None:
            raise RuntimeError("VerifiersEpisode.step without a pending model turn (reset first)")
        self.client.pending.set_result(action_text)
        self.shown += 1  # the policy's own turn
        tool_call = bool(parse_tool_calls(action_text).calls)
        messages = self._advance()
        if messages is not None:
            return StepResult(messages, 0.0, False, False, {"tool_call": tool_call})
        info = {"tool_call": tool_call, "stop_condition": self.state.get("stop_condition"),
                "metrics": dict(self.state.get("metrics") or {})}
        return StepResult("", float(self.state["reward"]), True, False, info)

    def _advance(self) -> list[dict] | None:
        """Runs the rollout until its next model turn (the new messages, as chat dicts) or its end (None)."""
        async def until_turn_or_end():
            while self.client.pending is None and not self.rollout.done():
                await asyncio.sleep(0)

        self.loop.run_until_complete(until_turn_or_end())
        if self.rollout.done():
            self.state = self.rollout.result()  # raises what the rollout raised
            self.loop.close()
            return None
        prompt = self.client.request[0]
        new = chat_messages(prompt[self.shown:])
        self.shown = len(prompt)
        return new

    def __del__(self):  # an episode cut by the loop's limits: end its pending rollout
        loop, rollout = self.loop, self.rollout
        if loop is not None and not loop.is_closed() and rollout is not None:
            rollout.cancel()
            try:
                loop.run_until_complete(asyncio.gather(rollout, return_exceptions=True))
            finally:
                loop.close()


class VerifiersTask(EnvTask):
    """The rows of verifiers environment ``env_id`` (built with ``env_args``) played as episodes.

    Splits: "train" is the environment's ``dataset`` and "heldout" its ``eval_dataset`` when it
    has both; otherwise its one data set split by the hash of each row's prompt
    (``heldout_fraction``).
    """

    name = "verifiers"
    correct_threshold = 1.0

    def __init__(self, env_id: str, env_args: Mapping[str, Any] | None = None, *,
                 heldout_fraction: float = DEFAULT_HELDOUT_FRACTION):
        self.vf = import_verifiers()
        loader = resolve_loader(env_id)
        self.env_id, self.env_args = env_id, check_env_args(env_id, loader, env_args or {})
        self.heldout_fraction = check_heldout_fraction(heldout_fraction)
        try:
            env = loader(**self.env_args)
        except ImportError:
            raise
        except Exception as err:
            raise VerifiersEnvError(f"verifiers environment {env_id!r} with arguments {self.env_args} could not be "
                                    f"built: {type(err).__name__}: {err}") from err
        if not isinstance(env, self.vf.Environment):
            raise VerifiersEnvError(f"task.kwargs.env_id = {env_id!r} returned {type(env).__name__}, not a verifiers "
                                    "(0.3 legacy API) Environment")
        if env.rubric.has_group_rewards:
            raise VerifiersEnvError(f"verifiers environment {env_id!r}: its rubric has group reward functions, which "
                                    "need a group's rollouts together; valid: a rubric of per-rollout reward functions")
        self.env = env
        self.client_class = make_loop_client(self.vf)
        self.rows = self._rows()

    def _rows(self) -> dict[str, list[dict]]:
        """Each split's rows (plain dicts, in data set order)."""
        has_train = self.env.dataset is not None or self.env.dataset_source is not None
        has_eval = self.env.eval_dataset is not None or self.env.eval_dataset_source is not None
        if has_train and has_eval:
            return {TRAIN: list(self.env.get_dataset()), HELDOUT: list(self.env.get_eval_dataset())}
        rows = list(self.env.get_dataset() if has_train else self.env.get_eval_dataset())
        out = {TRAIN: [], HELDOUT: []}
        for row in rows:
            out[split_of(f"{self.env_id} {json.dumps(row['prompt'], sort_keys=True, default=str)}",
                         self.heldout_fraction)].append(row)
        return out

    async def score(self, row: dict, client) -> Any:
        """verifiers' rollout of ``row`` with ``client``, scored by the rubric (its own run_rollout's steps)."""
        state = await self.env.rollout(row, client, MODEL_NAME, {})
        await self.env.rubric.score_rollout(state)
        await self.env.rubric.cleanup(state)
        return state

    def row(self, example: Example) -> dict:
        return self.rows[example.split][int(example.metadata["index"])]

    def example(self, split: str, index: int) -> Example:
        row = self.rows[split][index]
        prompt = row["prompt"]
        text = prompt[-1]["content"] if isinstance(prompt, list) and prompt else str(prompt)
        return Example(id=f"verifiers/{self.env_id}/{split}/{row.get('example_id', index)}", task=self.name,
                       prompt=str(text), answer=str(row.get("answer") or ""), split=split,
                       metadata={"env_id": self.env_id, "index": index})

    def all_examples(self, split: str) -> list[Example]:
        return [self.example(split, i) for i in range(len(self.rows[split]))]

    def examples(self, split: str, n: int, *, seed: int, unique: bool = False) -> list[Example]:
        self._check_request(split, n)
        size = len(self.rows[split])
        if size == 0 or (unique and n > size):
            raise ValueError(f"task {self.name!r} ({self.env_id}): {n} {'distinct ' if unique else ''}{split} rows "
                             f"requested, the split has {size}")
        rng = random.Random(seed)
        picks = rng.sample(range(size), n) if unique else [rng.randrange(size) for _ in range(n)]
        return [self.example(split, i) for i in picks]

    def make_env(self) -> VerifiersEpisode:
        return VerifiersEpisode(self)
