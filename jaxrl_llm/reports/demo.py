"""The main job (`make demo`, `jaxrl demo`): held-out pass@1 before, RL training, pass@1
after, a training figure and the bias report, with one rollout engine serving all three
(with metrics.wandb on, the figures, the bias table and both pass@k curves go to the
run's W&B run at its last step)."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import time

from jaxrl_llm.train.config import Config
from jaxrl_llm.train.sample.engines import engine_spec, make_engine
from jaxrl_llm.train.run.evaluation import append_eval, evaluate, held_out
from jaxrl_llm.train.run.loop import train
from jaxrl_llm.train.run.plots import plot_runs
from jaxrl_llm.train.policy import load_policy
from jaxrl_llm.train.sample.prompts import task_from_config
from jaxrl_llm.train.run.tracking import require_wandb, wandb_run

EVAL_SEED = 12345
PANELS = ["reward", "pass_rate", "length_correct", "length_incorrect", "entropy", "grad_norm"]


def _say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def _describe_engine(cfg: Config) -> str:
    if cfg.rollout.engine == "vllm":
        return (f"vLLM server ({cfg.rollout.server_dtype}) on 127.0.0.1, weights synced through the bridge "
                "every step")
    return "JAX sampler (in process)"


def _pass_line(result: dict, samples: int) -> str:
    return (f"pass@1 {result['pass@1']:.3f}  pass@{samples} {result[f'pass@{samples}']:.3f}  "
            f"({result['num_prompts']} questions x {samples} samples)")


def run_demo(cfg: Config, *, resume: bool = False) -> dict:
    """Runs the demo of `cfg` into cfg.run_path (fresh unless `resume`); returns its summary."""
    require_wandb(cfg.metrics)  # before anything is deleted or loaded
    if os.path.exists(cfg.run_path) and not resume:
        shutil.rmtree(cfg.run_path)
    os.makedirs(cfg.run_path, exist_ok=True)
    start = time.perf_counter()
    samples = cfg.task.eval_samples
    _say(f"{cfg.name}: {cfg.recipe.name} on {cfg.task.name} ({cfg.total_steps} steps of "
         f"{cfg.rollout.prompts_per_step} prompts x {cfg.rollout.samples_per_prompt} samples)")
    _say(f"rollout engine: {_describe_engine(cfg)}")
    policy = load_policy(cfg.model.source)
    task = task_from_config(cfg)
    with contextlib.ExitStack() as outer:
        tracker = wandb_run(cfg)
        if tracker is not None:
            outer.callback(tracker.finish)
        with contextlib.ExitStack() as stack:
            engine = make_engine(engine_spec(cfg), policy, policy.params, stack=stack)
            before = evaluate(engine, policy, task, held_out(cfg), samples=samples, seed=EVAL_SEED)
            _say(f"held-out before: {_pass_line(before, samples)}")
            out = train(cfg, task=task, resume=resume, policy=policy, engine=engine, wandb=tracker)
            # the engine now serves the trained weights
            after = evaluate(engine, policy, task, held_out(cfg), samples=samples, seed=EVAL_SEED)
        _say(f"held-out after:  {_pass_line(after, samples)}")
        _say(f"held-out pass@1 change: {after['pass@1'] - before['pass@1']:+.3f}")
        for label, result in (("before", before), ("after", after)):
            for shown in result["examples"]:
                _say(f"{label}: {shown['prompt']!r} -> {shown['completion']!r} (reward {shown['reward']:g})")
        png = _report(cfg, before, after, out.step, tracker)
    summary = {"engine": _describe_engine(cfg), "before": before, "after": after, "steps": out.step,
               "wall_s": time.perf_counter() - start}
    with open(os.path.join(cfg.run_path, "demo_summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    _say(f"wrote {png}, {cfg.run_path}/bias/*.png, metrics.jsonl, eval.jsonl; engine {cfg.rollout.engine}; "
         f"wall {summary['wall_s'] / 60:.1f} min")
    return summary


def _report(cfg: Config, before: dict, after: dict, step: int, tracker) -> str:
    """eval.jsonl's before/after records, the training figure (its path returned) and the bias
    report; the same to W&B, at the run's last step, where it is on."""
    append_eval(cfg.run_path, 0, before)
    append_eval(cfg.run_path, step, after)
    png = os.path.join(cfg.run_path, "training.png")
    plot_runs([cfg.run_path], metrics=PANELS, out_png=png, title=f"{cfg.name}: training")
    from jaxrl_llm.reports import bias_report

    bias = os.path.join(cfg.run_path, "bias")
    bias_report.run(bias, seed=0)
    if tracker is not None:
        tracker.log_eval(step, before, key="heldout_before/pass_at_k")
        tracker.log_eval(step, after, key="heldout_after/pass_at_k")
        tracker.log_media(step, images={"training": png, "bias/length_bias": os.path.join(bias, "length_bias.png"),
                                        "bias/difficulty_bias": os.path.join(bias, "difficulty_bias.png")},
                          tables={"bias/table": os.path.join(bias, "bias_table.csv")})
    return png
