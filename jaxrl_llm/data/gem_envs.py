"""GEM's environments as multi-turn tasks: ``task.name=gem`` with ``task.kwargs.env_id``.

GEM ("a Gym for generalist LLMs", Liu et al. 2025, arXiv 2510.01051; PyPI ``gem-llm``,
the optional ``gem`` extra) registers text games, reasoning-gym data sets and tool
wrappers under ids such as ``game:GuessTheNumber-v0-easy`` or ``rg:leg_counting``. Any id
that can be built offline runs, unchanged, through the project's multi-turn loop
(train/sample/episodes.py) on either engine::

    task.name=gem task.kwargs='{"env_id": "game:GuessTheNumber-v0-easy"}'
    task.kwargs='{"env_id": "game:Mastermind-v0-easy", "max_turns": 12}'     # + the env's own arguments
    task.kwargs='{"env_id": "rg:leg_counting", "tools": ["python"]}'          # + GEM's Python tool, sandboxed

Examples: one GEM episode per seed. An example is a game seed drawn from the step's seed
(``examples`` is a pure function of (split, n, seed), as for every task); the split rule's
key is ``"<env_id> seed <s>"``: the seed is the game (its hidden state is not in the first
message), so held-out means unseen seeds, not necessarily unseen games (GuessTheNumber-easy
has 10 secrets).

Episodes: the task builds the GEM env once (``gem.make(env_id, **kwargs)``, its tool
wrapper, seeded construction); each episode is a deep copy of that prototype reset with
the example's seed: a fresh env, as GEM's reset-many-times envs would not be (reasoning-gym's
envs count their resets), at the cost of one copy (Sokoban-hard takes ~3 s to build).
The policy's turn goes to ``env.step`` as text; GEM's observation becomes the next user
turn, rendered as GEM's ObservationWrapper renders one observation (info "prefix" + text +
info "suffix"). The loop appends the policy's sampled ids and each observation's chat-template
ids turn by turn; the history is never re-tokenized. Rewards are GEM's step rewards (success
1.0, format error -0.1, ...); an episode is correct when their sum reaches 1.0.

Global random state: GEM's ``reset(seed)`` calls ``random.seed`` and ``np.random.seed``
and its games draw from those globals. Every GEM call (build, copy, reset, step) runs on the
episode's own :class:`~jaxrl_llm.data.global_rng.GlobalRng` (seeded with the example's seed),
so an episode is a function of (env, seed, actions) and the trainer's global state never moves.

Refused, with one line: an unknown id; an env that downloads data when built (Wordle and
Hangman call ``nltk.download``; WordSearch needs NLTK's "words" corpus; math:, code:, qa:,
eval: and logic: ids load Hugging Face Hub data sets); env arguments its class does not take
(GEM's classes swallow unknown ones silently).
"""
from __future__ import annotations

import copy
import difflib
import importlib
import inspect
import json
import logging
import random
from typing import Any, Iterator, Sequence

from jaxrl_llm.data.environments import EnvTask, StepResult
from jaxrl_llm.data.global_rng import GlobalRng
from jaxrl_llm.data.records import Example, check_heldout_fraction, short_hash, split_of
from jaxrl_llm.data.task_base import DEFAULT_HELDOUT_FRACTION, GeneratedTask
from jaxrl_llm.rewards import SandboxLimits

INSTALL = "pip install -e '.[gem]' && pip install --no-deps gem-llm==0.1.0"
TOOLS = ("python",)  # task.kwargs.tools: GEM's Python tool, run in the project's sandbox (data/gem_tools.py)
SEED_SPACE = 2**31  # game seeds: GEM wants an int >= 0, np.random.seed one below 2**32
PROTOTYPE_SEED = 0  # the global random state the prototype is built under
_NLTK_DOWNLOAD = "calls nltk.download('words') whenever it is built, which needs the network"
_HUB = "loads its data set from the Hugging Face Hub when built (for local data: task.data_path)"
# Entry-point modules whose environments fetch data, and how.
DOWNLOADS = {
    "gem.envs.game_env.wordle": _NLTK_DOWNLOAD,
    "gem.envs.game_env.hangman": _NLTK_DOWNLOAD,
    "gem.envs.math_env": _HUB,
    "gem.envs.math_visual_env": _HUB,
    "gem.envs.code_env": _HUB,
    "gem.envs.qa_env": _HUB,
}
NLTK_CORPUS = {"gem.envs.game_env.word_search": "corpora/words"}  # built offline once the corpus is installed


class GemEnvError(ValueError):
    """A GEM environment that cannot run here: unknown id, needs a download, bad arguments, fails to build."""


def import_gem():
    """The ``gem`` package, imported with the root logger left as it was (``import gem`` calls
    ``logging.basicConfig(level=INFO)``); ImportError naming what to install if it is missing."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        import gem
        import gem.envs.registration  # noqa: F401
    except ImportError as err:
        raise ImportError(f"task.name = 'gem' needs the gem-llm package, which cannot be imported ({err}); "
                          f"install it with: {INSTALL}") from None
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return gem


def offline_ids(registry: dict) -> list[str]:
    """The registered ids whose entry points fetch nothing when built (WordSearch counted as offline)."""
    return sorted(i for i, spec in registry.items() if _module(spec) not in DOWNLOADS)


def _module(spec) -> str:
    entry = spec.entry_point
    return entry.partition(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", "")


def _env_class(spec):
    entry = spec.entry_point
    if not isinstance(entry, str):
        return entry
    module, _, name = entry.partition(":")
    return getattr(importlib.import_module(module), name)


def check_env_id(env_id: Any, registry: dict) -> Any:
    """The registry's spec of ``env_id``; GemEnvError if it is unknown or fetches data when built."""
    if not isinstance(env_id, str) or env_id not in registry:
        close = difflib.get_close_matches(str(env_id), list(registry), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        games = [i for i in offline_ids(registry) if i.startswith("game:")]
        raise GemEnvError(f"task.kwargs.env_id = {env_id!r} is not a GEM environment{hint}; valid: a registered id "
                          f"that builds offline: {', '.join(games)}, or rg:<reasoning-gym data set>")
    spec = registry[env_id]
    module = _module(spec)
    reason = DOWNLOADS.get(module)
    if reason is None and module in NLTK_CORPUS:
        import nltk
        try:
            nltk.data.find(NLTK_CORPUS[module])
        except LookupError:
            reason = f"needs NLTK's {NLTK_CORPUS[module]!r}, which is not installed (python -m nltk.downloader words)"
    if reason is not None:
        raise GemEnvError(f"task.kwargs.env_id = {env_id!r}: this GEM environment {reason}; valid: an id that "
                          "builds offline, e.g. 'game:GuessTheNumber-v0-easy', 'game:Mastermind-v0-easy', "
                          "rg:<reasoning-gym data set>")
    return spec


def check_env_kwargs(env_id: str, env_class, env_kwargs: dict[str, Any]) -> None:
    """GemEnvError if ``env_kwargs`` names an argument ``env_class.__init__`` does not declare."""
    params = inspect.signature(env_class.__init__).parameters.values()
    named = [p.name for p in params if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = sorted(set(env_kwargs) - set(named))
    if unknown:
        raise GemEnvError(f"task.kwargs {', '.join(map(repr, unknown))}: not an argument of GEM environment "
                          f"{env_id!r} ({env_class.__name__}); valid: {', '.join(named)}, or the adapter's "
                          f"{', '.join(ADAPTER_ARGUMENTS)}")


ADAPTER_ARGUMENTS = ("env_id", "tools", "tool_reward", "tool_success_reward", "max_tool_uses", "sandbox",
                     "heldout_fraction", "prompt_messages")
ROLES = ("system", "user", "assistant")  # of task.kwargs.prompt_messages


def check_prompt_messages(messages: Any) -> tuple[dict[str, str], ...]:
    """``task.kwargs.prompt_messages`` as chat messages; GemEnvError naming the bad entry otherwise."""
    valid = (f"valid: a list of {{\"role\": one of {', '.join(ROLES)}, \"content\": text}}, e.g. "
             '[{"role": "user", "content": "Enter your first guess."}, {"role": "assistant", "content": "\\\\boxed{5}"}]')
    if not isinstance(messages, (list, tuple)):
        raise GemEnvError(f"task.kwargs.prompt_messages = {messages!r:.80} is not a list; {valid}")
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and set(m) == {"role", "content"} and m["role"] in ROLES
                and isinstance(m["content"], str)):
            raise GemEnvError(f"task.kwargs.prompt_messages[{i}] = {m!r:.80} is not a chat message; {valid}")
    return tuple(dict(m) for m in messages)


def render_observation(observation: str, info: dict) -> str:
    """GEM's text of one observation as its ObservationWrapper writes it: info "prefix", the text,
    and info "suffix" (the next-move prompt, e.g. "Enter your next guess.") on a new line."""
    text = str(info.get("prefix", "")) + observation
    suffix = info.get("suffix")
    if suffix:
        text = (text if not text or text.endswith("\n") else text + "\n") + str(suffix)
    return text


class GemEnv:
    """One episode of a GEM environment (:class:`~jaxrl_llm.data.environments.Environment`):
    a deep copy of the task's prototype, reset with the example's seed, every GEM call on the
    episode's own global random state."""

    def __init__(self, prototype, prompt_messages: Sequence[dict[str, str]] = ()):
        self.prototype, self.prompt_messages = prototype, tuple(prompt_messages)
        self.env = None
        self.rng: GlobalRng | None = None
        self.tool_uses = self.tool_successes = 0

    def reset(self, example: Example) -> tuple[str, dict]:
        seed = int(example.metadata["seed"])
        self.rng = GlobalRng.seeded(seed)
        with self.rng.installed():
            self.env = copy.deepcopy(self.prototype)
            observation, info = self.env.reset(seed=seed)
        text = render_observation(observation, info)
        if self.prompt_messages:  # the chat turns placed before GEM's first observation
            return [*map(dict, self.prompt_messages), {"role": "user", "content": text}], dict(info)
        return text, dict(info)

    def step(self, action_text: str) -> StepResult:
        if self.env is None:
            raise RuntimeError("GemEnv.step before reset")
        with self.rng.installed():
            observation, reward, terminated, truncated, info = self.env.step(action_text)
        info = dict(info)
        uses, successes = int(info.get("tool_use_counter", 0)), int(info.get("tool_success_counter", 0))
        tool_call = uses > self.tool_uses
        info.update(tool_call=tool_call, tool_error=tool_call and successes == self.tool_successes)
        self.tool_uses, self.tool_successes = uses, successes
        done = bool(terminated) or bool(truncated)
        return StepResult("" if done else render_observation(observation, info), float(reward), bool(terminated),
                          bool(truncated), info)


class GemTask(GeneratedTask, EnvTask):
    """Seeds of GEM environment ``env_id`` (built with ``env_kwargs``), played as multi-turn episodes.

    tools: ``["python"]`` wraps the env in GEM's ToolEnvWrapper with GEM's Python tool run in
    the project's sandbox (``sandbox``: SandboxLimits fields); ``tool_reward`` /
    ``tool_success_reward`` / ``max_tool_uses`` are the wrapper's (GEM's defaults: 0, 0, 5).
    ``prompt_messages``: chat messages (a system prompt, a few-shot exchange) placed before GEM's
    first observation, which stays the last user turn, as GEM's trainers wrap it in a prompt template.
    """

    name = "gem"
    correct_threshold = 1.0  # GEM's success reward (gem.utils.constants.LanguageGameReward)

    def __init__(self, env_id: str, *, tools: Sequence[str] = (), tool_reward: float = 0.0,
                 tool_success_reward: float = 0.0, max_tool_uses: int = 5, sandbox: dict | None = None,
                 heldout_fraction: float = DEFAULT_HELDOUT_FRACTION, prompt_messages: Sequence[dict] = (),
                 **env_kwargs: Any):
        gem = import_gem()
        self.prompt_messages = check_prompt_messages(prompt_messages)
        spec = check_env_id(env_id, gem.envs.registration.ENV_REGISTRY)
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs)
        self.heldout_fraction = check_heldout_fraction(heldout_fraction)
        unknown_tools = [t for t in tools if t not in TOOLS] if isinstance(tools, (list, tuple)) else [tools]
        if unknown_tools:
            raise GemEnvError(f"task.kwargs.tools = {tools!r}: unknown tool(s) {unknown_tools}; valid: a list of "
                              f"{', '.join(map(repr, TOOLS))}")
        self.tools = tuple(tools)
        self.limits = SandboxLimits.from_mapping(sandbox)
        try:
            env_class = _env_class(spec)
        except ImportError as err:
            raise ImportError(f"GEM environment {env_id!r} cannot be imported ({err}); install: {INSTALL}") from None
        check_env_kwargs(env_id, env_class, self.env_kwargs)
        self.prototype = self._build(gem, tool_reward, tool_success_reward, max_tool_uses)

    def _build(self, gem, tool_reward: float, tool_success_reward: float, max_tool_uses: int):
        """The prototype: the env (and its tool wrapper) built on a seeded global random state."""
        from gem.tools.tool_env_wrapper import ToolEnvWrapper

        from jaxrl_llm.data.gem_tools import SandboxPythonTool
        try:
            with GlobalRng.seeded(PROTOTYPE_SEED).installed():
                env = gem.make(self.env_id, **self.env_kwargs)
                if self.tools:
                    env = ToolEnvWrapper(env, tools=[SandboxPythonTool(self.limits)], tool_reward=tool_reward,
                                         tool_success_reward=tool_success_reward, max_tool_uses=max_tool_uses)
                copy.deepcopy(env)  # each episode copies it: fail here, once, if it cannot be copied
        except ImportError as err:  # gem.make: an env module whose own dependency is missing
            raise ImportError(f"GEM environment {self.env_id!r} needs a package that cannot be imported ({err}); "
                              f"install: {INSTALL}") from None
        except Exception as err:
            raise GemEnvError(f"GEM environment {self.env_id!r} with arguments {self.env_kwargs} could not be built: "
                              f"{type(err).__name__}: {err}") from err
        return env

    def example(self, game_seed: int) -> Example:
        kwargs = json.dumps(self.env_kwargs, sort_keys=True) if self.env_kwargs else ""
        game = f"{self.env_id}{'/' + short_hash(kwargs) if kwargs else ''}"
        return Example(id=f"gem/{game}/{game_seed}", task=self.name,
                       prompt=f"GEM {self.env_id}, seed {game_seed} (the environment writes the first message)",
                       answer="", split=split_of(f"{self.env_id}{kwargs} seed {game_seed}", self.heldout_fraction),
                       metadata={"env_id": self.env_id, "seed": game_seed, "env_kwargs": dict(self.env_kwargs)})

    def _stream(self, seed: int) -> Iterator[Example]:
        rng = random.Random(seed)
        while True:
            yield self.example(rng.randrange(SEED_SPACE))

    def make_env(self) -> GemEnv:
        return GemEnv(self.prototype, self.prompt_messages)
