"""GEM environments (data/gem_envs.py) in the project's multi-turn loop: a scripted policy whose
text goes through the real tokenizer and chat template (tests/envs/scripted_engine.py), the
episodes' determinism under any global random state, the trainer's global random state left
untouched, and GEM's Python tool run in the project's sandbox."""
import random
import re

import numpy as np
import pytest

from jaxrl_llm.data import make_task
from jaxrl_llm.rollout.types import SamplingParams
from jaxrl_llm.train.sample.episodes import EpisodeLimits, run_episodes
from tests.envs.scripted_engine import FakeScriptedEngine

EASY = "game:GuessTheNumber-v0-easy"  # a secret in 1..10, 4 turns (GEM's registration)
NEXT = "Enter your next guess."  # GEM's GuessTheNumber suffix (info["suffix"])
HINT = re.compile(r"you guessed (\d+), and the target number is (higher|lower)")


def binary_search(history: str) -> str:
    low, high = 1, 10
    for guess, hint in HINT.findall(history):
        low, high = (int(guess) + 1, high) if hint == "higher" else (low, int(guess) - 1)
    return f"My guess is \\boxed{{{(low + high) // 2}}}."


def hand_binary_search(secret: int) -> list[int]:
    guesses, low, high = [], 1, 10
    while not guesses or guesses[-1] != secret:
        guesses.append((low + high) // 2)
        low, high = (guesses[-1] + 1, high) if secret > guesses[-1] else (low, guesses[-1] - 1)
    return guesses


def policy_spans(mask) -> int:
    """Runs of 1s in a loss mask: the policy's turns."""
    mask = list(mask)
    return sum(1 for i, m in enumerate(mask) if m == 1 and (i == 0 or mask[i - 1] != 1))


@pytest.fixture(scope="module")
def easy():
    return make_task("gem", env_id=EASY)


def test_binary_search_scores_one_through_the_loop(policy, easy):
    import gem

    examples = easy.examples("train", 6, seed=0)
    engine = FakeScriptedEngine(policy, binary_search)
    batch = run_episodes(engine, policy, easy, examples, 1, SamplingParams(seed=0),
                         EpisodeLimits(max_turns=4, max_tokens=512, turn_max_tokens=32))
    np.testing.assert_array_equal(batch.rewards, np.ones((6, 1)))
    turns = []
    for record, example in zip(batch.rollouts.records, examples):
        seed = example.metadata["seed"]
        secret = random.Random(seed).randint(1, 10)  # GEM's reset: random.seed(seed), then the secret is drawn
        guesses = hand_binary_search(secret)
        first, _ = gem.make(EASY).reset(seed=seed)  # GEM's own instructions for this seed
        dialogue = [{"role": "user", "content": first + NEXT}]
        for turn, guess in enumerate(guesses, start=1):
            dialogue.append({"role": "assistant", "content": f"My guess is \\boxed{{{guess}}}."})
            if guess != secret:
                hint = "higher" if secret > guess else "lower"
                dialogue.append({"role": "user", "content": f"At turn {turn}, you guessed {guess}, and the target "
                                                            f"number is {hint} than {guess}.\n{NEXT}"})
        # the episode's ids are the chat template's rendering of the whole dialogue, built turn by turn
        full = np.concatenate([record.prompt_token_ids, record.completion_token_ids]).tolist()
        rendered = policy.chat.render(dialogue, add_generation_prompt=False)
        assert policy.tokenizer.decode(full, skip_special_tokens=False) == rendered.rstrip("\n")
        assert policy_spans(record.loss_mask) == len(guesses) and record.finish_reason == "stop"
        turns.append(len(guesses))
    assert batch.metrics["episode_turns"] == pytest.approx(np.mean(turns)) and max(turns) > 1


FEW_SHOT = [{"role": "system", "content": "Reply with one guess written as \\boxed{N}."},
            {"role": "user", "content": "Enter your first guess."}, {"role": "assistant", "content": "\\boxed{5}"}]


def test_prompt_messages_come_before_gems_first_observation(policy):
    """task.kwargs.prompt_messages: the episode is the chat template's rendering of those messages,
    then GEM's own first observation as the next user turn, then the game; GEM scores it as before."""
    import gem

    task = make_task("gem", env_id=EASY, prompt_messages=FEW_SHOT)
    examples = task.examples("train", 3, seed=5)
    batch = run_episodes(FakeScriptedEngine(policy, binary_search), policy, task, examples, 1, SamplingParams(seed=0),
                         EpisodeLimits(max_turns=4, max_tokens=512, turn_max_tokens=32))
    np.testing.assert_array_equal(batch.rewards, np.ones((3, 1)))
    for record, example in zip(batch.rollouts.records, examples):
        first, _ = gem.make(EASY).reset(seed=example.metadata["seed"])
        prompt = policy.tokenizer.decode(record.prompt_token_ids.tolist(), skip_special_tokens=False)
        assert prompt == policy.chat.render([*FEW_SHOT, {"role": "user", "content": first + NEXT}],
                                            add_generation_prompt=True)


def cycle_moves(history: str) -> str:
    """2048 moves up, left, down, right, ... by the number of turns played so far."""
    played = history.count("<|im_start|>assistant") - 1
    return f"\\boxed{{{('up', 'left', 'down', 'right')[played % 4]}}}"


def test_an_episode_is_a_function_of_its_seed(policy):
    """Game2048 draws a random tile after every move from the global `random`: the same seed
    gives the same episode whatever the global state and whichever episodes share the batch
    (a resumed process has neither the straight run's global state nor its earlier episodes)."""
    task = make_task("gem", env_id="game:Game2048-v0-easy")
    examples = task.examples("train", 3, seed=1)
    limits = EpisodeLimits(max_turns=4, max_tokens=1024, turn_max_tokens=16)
    random.seed(1)
    np.random.seed(1)
    together = run_episodes(FakeScriptedEngine(policy, cycle_moves), policy, task, examples, 2, SamplingParams(seed=0),
                            limits).rollouts.records
    random.seed(2)
    np.random.seed(2)
    alone = run_episodes(FakeScriptedEngine(policy, cycle_moves), policy, task, examples[1:2], 1, SamplingParams(seed=0),
                         limits).rollouts.records
    ids = [np.concatenate([r.prompt_token_ids, r.completion_token_ids]).tolist() for r in together + alone]
    assert all(policy_spans(r.loss_mask) == 4 for r in together + alone)  # four moves, three boards after moves
    assert ids[2] == ids[3] == ids[6]  # example 1: twice in the batch, once alone under another global state
    assert ids[0] == ids[1] and ids[0] != ids[2] and ids[2] != ids[4]  # other seeds, other boards


def test_the_global_random_state_is_untouched(easy):
    import gem

    random.seed(123)
    np.random.seed(456)
    python, numpy = random.getstate(), np.random.get_state()
    task = make_task("gem", env_id="game:Game2048-v0-easy")  # GEM's constructors call reset() too
    for example in task.examples("train", 2, seed=0) + easy.examples("train", 2, seed=0):
        env = (task if example.metadata["env_id"] != EASY else easy).make_env()
        env.reset(example)
        env.step("\\boxed{up}")
        env.step("\\boxed{5}")
    assert random.getstate() == python
    after = np.random.get_state()
    assert after[0] == numpy[0] and np.array_equal(after[1], numpy[1]) and after[2:] == numpy[2:]
    gem.make(EASY).reset(seed=7)  # control: GEM itself reseeds the globals
    assert random.getstate() != python
    assert np.array_equal(np.random.get_state()[1], np.random.RandomState(7).get_state()[1])


CALCULATE = re.compile(r"Calculate (.+?)\.\n")
RESULT = re.compile(r"Code execution result: (-?\d[\d.]*)")  # not the instructions' mention


def python_then_answer(history: str) -> str:
    """Turn 1: GEM's Python tool computes the question's expression; turn 2: the tool's output, boxed."""
    result = RESULT.search(history)
    if result:
        return f"The answer is \\boxed{{{result.group(1)}}}."
    expression = CALCULATE.search(history).group(1)
    return f"<python>\nx = {expression}\nprint(int(x) if x == int(x) else x)\n</python>"


def test_gems_python_tool_runs_in_the_projects_sandbox(policy):
    task = make_task("gem", env_id="rg:basic_arithmetic", tools=["python"])
    examples = task.examples("train", 3, seed=0)
    batch = run_episodes(FakeScriptedEngine(policy, python_then_answer), policy, task, examples, 1,
                         SamplingParams(seed=0), EpisodeLimits(max_turns=3, max_tokens=512, turn_max_tokens=64))
    np.testing.assert_array_equal(batch.rewards, np.ones((3, 1)))  # reasoning-gym's grader, through GEM
    assert batch.metrics["episode_tool_calls"] == 1 and batch.metrics["episode_tool_errors"] == 0
    for record in batch.rollouts.records:
        text = policy.tokenizer.decode(record.completion_token_ids.tolist(), skip_special_tokens=False)
        x = eval(CALCULATE.search(policy.tokenizer.decode(record.prompt_token_ids.tolist())).group(1))  # trusted: rg's
        assert f"<|im_start|>user\nCode execution result: {int(x) if x == int(x) else x}\n\n<|im_end|>" in text
    # the code runs in the bubblewrap sandbox: the host's /etc is not there
    assert open("/etc/hostname").read()  # control: the host has it
    env = task.make_env()
    env.reset(examples[0])
    step = env.step("<python>\nimport os\nprint(sorted(os.listdir('/')))\nopen('/etc/hostname')\n</python>")
    assert step.info["tool_call"] and step.info["tool_error"] and not step.terminated
    assert "FileNotFoundError" in step.observation and "'etc'" not in step.observation
    assert "['bin', 'dev', 'job'" in step.observation  # the sandbox's own root


@pytest.mark.parametrize("kwargs, words", [
    ({"env_id": EASY, "tools": ["bash"]}, ["task.kwargs.tools = ['bash']", "valid: a list of 'python'"]),
    ({"env_id": EASY, "tools": "python"}, ["task.kwargs.tools = 'python'", "a list of"]),
    ({"env_id": EASY, "prompt_messages": "Guess."}, ["task.kwargs.prompt_messages = 'Guess.' is not a list"]),
    ({"env_id": EASY, "prompt_messages": [{"role": "robot", "content": "x"}]},
     ["task.kwargs.prompt_messages[0] = {'role': 'robot'", "valid: a list of {\"role\": one of system, user"]),
    ({"env_id": 7}, ["task.kwargs.env_id = 7 is not a GEM environment", "game:GuessTheNumber-v0-easy"]),
    ({"env_id": "game:Crosswords-v0-random"}, ["'game:Crosswords-v0-random'", "could not be built",
                                               "No words found"]),  # broken in gem-llm 0.1.0 itself
])
def test_bad_arguments_name_the_value_and_what_is_valid(kwargs, words):
    from jaxrl_llm.data.gem_envs import GemEnvError

    with pytest.raises(GemEnvError) as err:
        make_task("gem", **kwargs)
    for word in words:
        assert word in str(err.value), str(err.value)


BROKEN_IN_GEM = {"game:FifteenPuzzle-v0-random", "game:Crosswords-v0-random"}  # gem-llm 0.1.0 cannot build them
SLOW_TO_BUILD = {"game:Sokoban-v0-random"}  # ~21 s at load ~10 (GEM generates a room of random size)


def test_every_offline_game_builds_resets_and_steps():
    """Every registered game (but Sokoban-random) and two rg: ids: built, reset and stepped through
    the adapter with well-formed outputs (checked_reset / checked_step), or refused with one
    GemEnvError naming why."""
    from jaxrl_llm.data.environments import checked_reset, checked_step
    from jaxrl_llm.data.gem_envs import DOWNLOADS, NLTK_CORPUS, GemEnvError, import_gem

    registry = import_gem().envs.registration.ENV_REGISTRY
    games = sorted(i for i in registry if i.startswith("game:"))
    ran, refused = [], []
    for env_id in sorted(set(games) - SLOW_TO_BUILD) + ["rg:leg_counting", "rg:maze"]:
        module = registry[env_id].entry_point.partition(":")[0]
        try:
            task = make_task("gem", env_id=env_id)
        except GemEnvError as err:
            assert env_id in BROKEN_IN_GEM or module in DOWNLOADS or module in NLTK_CORPUS, (env_id, err)
            refused.append(env_id)
            continue
        env = task.make_env()
        observation, _ = checked_reset(env, task.examples("train", 1, seed=0)[0])
        step = checked_step(env, "\\boxed{1}")
        assert observation and (step.terminated or step.truncated or step.observation), env_id
        ran.append(env_id)
    assert len(ran) >= 27 and {"game:Sudoku-v0-easy", "game:TowerofHanoi-v0-easy", "game:Minesweeper-v0-easy",
                               "game:Mastermind-v0-easy", "game:Crosswords-v0-easy", "rg:maze"} <= set(ran)
    assert {"game:Wordle-v0-easy", "game:Hangman-v0-easy"} | BROKEN_IN_GEM <= set(refused)
