"""The commands a user types: `jaxrl <command> ...` (or `python -m jaxrl_llm.cli`).

  train         RL training from an experiment config (+ dotted overrides), --resume to continue
  eval          held-out pass@1 / pass@k / avg@k of a run's checkpoint (or of the base model)
  export        a run's checkpoint as a full HF directory (--merged: LoRA adapters merged into the base)
  plot          PNG comparison of several runs' metrics
  demo          the main job (`make demo`): Dr. GRPO on 1-digit addition, before/after pass@1, plots
  bias-report   the length- and difficulty-bias report of each recipe (table + PNGs)

Examples:
  jaxrl train --config experiments/demo.py train.lr=1e-5 total_steps=50
  jaxrl train --config experiments/demo.py --resume
  jaxrl eval --config experiments/demo.py --step latest
  jaxrl export --config experiments/demo.py train.lora_rank=1 --merged --out runs/demo_lora/hf
  jaxrl plot runs/demo_dr_grpo runs/demo_grpo --metrics reward,length_incorrect --out cmp.png
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _load(args: argparse.Namespace):
    from jaxrl_llm.train.config import load_config

    return load_config(args.config, args.overrides)


def _train(args: argparse.Namespace) -> int:
    from jaxrl_llm.train import loop

    cfg = _load(args)
    out = loop.train(cfg, resume=args.resume)
    print(f"run {out['run_dir']}: step {out['step']}, reward {out['metrics'].get('reward', float('nan')):.3f}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from jaxrl_llm.train import loop

    cfg = _load(args)
    policy = loop.load_policy(cfg.model.source)
    if args.step == "base":
        step, params = 0, policy.params
    else:
        step, params = loop.restore_params(cfg, policy, None if args.step == "latest" else int(args.step))
    result = loop.evaluate_params(cfg, policy, params, samples=args.samples, step=step)
    print(json.dumps({"step": step, **result}, indent=2))
    return 0


def _export(args: argparse.Namespace) -> int:
    """W + alpha/r * A @ B for a LoRA run (full weights for a full fine-tuning run) -> HF directory."""
    from jaxrl_llm.bridge import save_hf_dir
    from jaxrl_llm.models.lora import spec_from_train_config
    from jaxrl_llm.train import loop

    cfg = _load(args)
    if spec_from_train_config(cfg.train) is not None and not args.merged:
        raise SystemExit("export: this run trains LoRA adapters (train.lora_rank="
                         f"{cfg.train.lora_rank}); pass --merged to write base + adapters as full weights "
                         "(the adapters alone are in the run's checkpoints)")
    policy = loop.load_policy(cfg.model.source)
    step, params = loop.restore_params(cfg, policy, None if args.step == "latest" else int(args.step))
    out = save_hf_dir(policy.cfg, params, args.out, dtype=args.dtype, tokenizer_dir=policy.model_dir)
    print(f"step {step} -> {out}")
    return 0


def _plot(args: argparse.Namespace) -> int:
    from jaxrl_llm.train.plots import plot_main

    return plot_main(args.rest)


def _bias_report(args: argparse.Namespace) -> int:
    from jaxrl_llm.reports import bias_report

    bias_report.run(args.out, recipes=tuple(args.recipes), seed=args.seed)
    return 0


def _demo(args: argparse.Namespace) -> int:
    """Base-model held-out pass@1, Dr. GRPO training, pass@1 after, plots and the bias report."""
    import shutil

    from jaxrl_llm.reports import bias_report
    from jaxrl_llm.train import loop
    from jaxrl_llm.train.config import load_config
    from jaxrl_llm.train.plots import plot_runs

    cfg = load_config(args.config, args.overrides)
    if os.path.exists(cfg.run_path) and not args.resume:
        shutil.rmtree(cfg.run_path)  # the demo always starts fresh unless asked to resume
    start = time.perf_counter()
    policy = loop.load_policy(cfg.model.source)
    print(f"[demo] {cfg.name}: {cfg.recipe.name} on {cfg.task.name} ({cfg.total_steps} steps of "
          f"{cfg.rollout.prompts_per_step} prompts x {cfg.rollout.samples_per_prompt} samples)")
    before = loop.evaluate_params(cfg, policy, policy.params, step=0)
    print(f"[demo] held-out before: pass@1 {before['pass@1']:.3f}  "
          f"pass@{cfg.task.eval_samples} {before[f'pass@{cfg.task.eval_samples}']:.3f}  "
          f"({before['num_prompts']} questions x {cfg.task.eval_samples} samples)")
    out = loop.train(cfg, resume=args.resume, policy=policy)
    after = loop.evaluate_params(cfg, policy, out["params"], step=out["step"])
    print(f"[demo] held-out after:  pass@1 {after['pass@1']:.3f}  "
          f"pass@{cfg.task.eval_samples} {after[f'pass@{cfg.task.eval_samples}']:.3f}")
    print(f"[demo] held-out pass@1 change: {after['pass@1'] - before['pass@1']:+.3f}")
    for label, result in (("before", before), ("after", after)):
        for shown in result["examples"]:
            print(f"[demo] {label}: {shown['prompt']!r} -> {shown['completion']!r} (reward {shown['reward']:g})")
    png = os.path.join(cfg.run_path, "training.png")
    plot_runs([cfg.run_path], metrics=["reward", "pass_rate", "length_correct", "length_incorrect", "entropy",
                                       "grad_norm"], out_png=png, title=f"{cfg.name}: training")
    bias_report.run(os.path.join(cfg.run_path, "bias"), seed=0)
    summary = {"before": before, "after": after, "steps": out["step"], "wall_s": time.perf_counter() - start}
    with open(os.path.join(cfg.run_path, "demo_summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(f"[demo] wrote {png}, {cfg.run_path}/bias/*.png, metrics.jsonl, eval.jsonl; "
          f"wall {summary['wall_s'] / 60:.1f} min")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxrl", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def config_args(p, default=None):
        p.add_argument("--config", default=default, required=default is None,
                       help="experiment file (experiments/*.py[:ARG]) or a run's config .json")
        p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.lr=1e-5 recipe.name=grpo")

    train = sub.add_parser("train", help="RL training")
    config_args(train)
    train.add_argument("--resume", action="store_true", help="continue from the run's latest checkpoint")
    train.set_defaults(func=_train)

    ev = sub.add_parser("eval", help="held-out pass@k / avg@k")
    config_args(ev)
    ev.add_argument("--step", default="latest", help="checkpoint step, 'latest', or 'base' (untrained model)")
    ev.add_argument("--samples", type=int, default=None, help="samples per prompt (k); default task.eval_samples")
    ev.set_defaults(func=_eval)

    export = sub.add_parser("export", help="a checkpoint as an HF directory (LoRA: --merged)")
    config_args(export)
    export.add_argument("--out", required=True, help="output HF directory (written atomically)")
    export.add_argument("--step", default="latest", help="checkpoint step or 'latest'")
    export.add_argument("--merged", action="store_true", help="merge LoRA adapters into the base weights")
    export.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    export.set_defaults(func=_export)

    plot = sub.add_parser("plot", help="compare runs (see `jaxrl plot -- --help`)", add_help=False)
    plot.add_argument("rest", nargs=argparse.REMAINDER)
    plot.set_defaults(func=_plot)

    demo = sub.add_parser("demo", help="the main job (make demo)")
    config_args(demo, default="experiments/demo.py")
    demo.add_argument("--resume", action="store_true")
    demo.set_defaults(func=_demo)

    bias = sub.add_parser("bias-report", help="per-recipe length/difficulty bias table and PNGs")
    bias.add_argument("--out", default="runs/bias_report")
    bias.add_argument("--recipes", nargs="+", default=["grpo", "dr_grpo", "dapo", "olmo3", "rloo"])
    bias.add_argument("--seed", type=int, default=0)
    bias.set_defaults(func=_bias_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
