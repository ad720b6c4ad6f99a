"""Below the run plan, train/ functions take the config sections they read, not the whole `Config`
(docs/architecture.md, "The train package"). The whole config is read where a run is set up:
the functions in READS_THE_WHOLE_CONFIG, and config/ itself (the schema and its checks)."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "jaxrl_llm" / "train"

# path under jaxrl_llm/train : function, for every function that takes a whole Config.
READS_THE_WHOLE_CONFIG = {
    "plan.py:plan_run",  # the run plan
    "run/loop.py:train",  # the run's set-up
    "run/run_state.py:make_learner", "run/run_state.py:restore_params",  # the learner of a run's config
    "run/evaluation.py:evaluate_params", "run/evaluation.py:held_out",  # an evaluation's set-up
    "sample/engines.py:engine_spec",  # the engine's set-up
    "sample/prompts.py:task_from_config",  # the task a config names
    # run_info.json and the W&B run record the whole config
    "run/provenance.py:_config_dict", "run/provenance.py:collect_run_info", "run/provenance.py:write_run_info",
    "run/metrics.py:MetricsWriter.__init__", "run/tracking.py:wandb_run", "run/tracking.py:WandbRun.__init__",
    # not narrowed yet: the sampling modes
    "sample/stage.py:StepSampling.__init__", "sample/stage.py:PlainBatch.__init__",
    "sample/stage.py:Episodes.__init__", "sample/stage.py:step_sampling",
}


def _names_config(annotation: ast.expr | None) -> bool:
    """Whether an annotation names the whole `Config` (alone, in a union, or as a string)."""
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    return any(isinstance(node, ast.Name) and node.id == "Config" for node in ast.walk(annotation))


def whole_config_takers(root: Path, skip: tuple[str, ...] = ("config",)) -> set[str]:
    """'path:function' (methods as Class.method) of every function under `root` with a parameter
    annotated as a whole Config; files under the folders `skip` are not read."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in skip:
            continue

        def visit(node: ast.AST, prefix: str = "") -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef):
                    visit(child, f"{prefix}{child.name}.")
                elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = child.args
                    params = a.posonlyargs + a.args + a.kwonlyargs + [p for p in (a.vararg, a.kwarg) if p]
                    if any(_names_config(p.annotation) for p in params):
                        found.add(f"{rel.as_posix()}:{prefix}{child.name}")
                    visit(child, f"{prefix}{child.name}.")

        visit(ast.parse(path.read_text()))
    return found


def test_whole_config_takers_by_hand(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "schema.py").write_text("def check(cfg: Config): ...\n")
    (tmp_path / "sample").mkdir()
    (tmp_path / "sample" / "a.py").write_text(
        "def whole(cfg: Config, n: int): ...\n"
        "def maybe(*, config: 'Config | None' = None): ...\n"
        "def section(rollout: RolloutConfig, cfg=None): ...\n"
        "class Mode:\n"
        "    def __init__(self, cfg: Config): ...\n"
        "    def step(self, task: TaskConfig): ...\n")
    assert whole_config_takers(tmp_path) == {"sample/a.py:whole", "sample/a.py:maybe", "sample/a.py:Mode.__init__"}


def test_only_the_set_up_takes_the_whole_config():
    found = whole_config_takers(TRAIN)
    new, gone = sorted(found - READS_THE_WHOLE_CONFIG), sorted(READS_THE_WHOLE_CONFIG - found)
    assert not new, (f"these take the whole Config below the run plan: {new}; pass the sections they read "
                     "(e.g. cfg.rollout) or the values, or, for a run's set-up, add them to READS_THE_WHOLE_CONFIG")
    assert not gone, f"READS_THE_WHOLE_CONFIG names functions that no longer take a Config: {gone}; remove them"
