"""The commands a user types: `jaxrl <command> ...` (or `python -m jaxrl_llm.cli`).

  train         RL training from an experiment config (+ dotted overrides), --resume to continue
  eval          held-out pass@1 / pass@k / avg@k of a run's checkpoint (or of the base model)
  export        a run's checkpoint as a full HF directory (--merged: LoRA adapters merged into the base)
  plot          PNG comparison of several runs' metrics
  demo          the main job (`make demo`): Dr. GRPO on 1-digit addition, before/after pass@1, plots
  bias-report   the length- and difficulty-bias report of each recipe (table + PNGs)
  compile       every program of one RL step compiled for a TPU slice from shapes (no TPU, no weights):
                HBM per chip, fits or not, FLOPs, bytes, collectives, a roofline estimate (docs/tpu.md)
  serve-tinker  the Tinker API (tinker SDK 0.38) on the JAX learner and sampler, for tinker-cookbook
                recipes (docs/tinker.md)

Examples:
  jaxrl train --config experiments/demo.py train.lr=1e-5 total_steps=50
  jaxrl train --config experiments/demo.py --resume
  jaxrl eval --config experiments/demo.py --step latest
  jaxrl export --config experiments/demo.py train.lora_rank=1 --merged --out runs/demo_lora/hf
  jaxrl plot runs/demo_dr_grpo runs/demo_grpo --metrics reward,length_incorrect --out cmp.png
  jaxrl compile --config experiments/demo.py --topology v5e-8 --model qwen2.5-1.5b train.precision=bf16
  JAXRL_TINKER_API_KEY=tml-secret jaxrl serve-tinker --base-model smollm2 --port 8000

A user error (unknown key, bad value, missing file, a combination the loop cannot run)
prints one line naming the problem and exits with status 2; --debug shows the traceback.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

USAGE_ERROR = 2


class UserError(Exception):
    """A problem with what the user asked for; reported as one line, exit status 2."""


def _user_error_types() -> tuple[type[BaseException], ...]:
    """Exceptions that name a user's mistake (a config value, a path, a data file), not a bug."""
    from jaxrl_llm.bridge import CheckpointError
    from jaxrl_llm.data import ChatTemplateError, DatasetFormatError
    from jaxrl_llm.train.config import ConfigError

    return (UserError, ConfigError, DatasetFormatError, ChatTemplateError, CheckpointError, FileNotFoundError,
            FileExistsError, NotADirectoryError, IsADirectoryError)


def _load(args: argparse.Namespace):
    from jaxrl_llm.train.config import load_config

    return load_config(args.config, args.overrides)


def _train(args: argparse.Namespace) -> int:
    from jaxrl_llm.train.run.loop import train

    out = train(_load(args), resume=args.resume)
    print(f"run {out.run_dir}: step {out.step}, reward {out.metrics.get('reward', float('nan')):.3f}")
    return 0


def _checkpoint_step(text: str) -> int | None:
    if text == "latest":
        return None
    try:
        return int(text)
    except ValueError:
        raise UserError(f"--step {text!r} is invalid; valid: a checkpoint step (an int), 'latest' or 'base'") from None


def _eval(args: argparse.Namespace) -> int:
    from jaxrl_llm.train.run.evaluation import evaluate_params
    from jaxrl_llm.train.policy import load_policy
    from jaxrl_llm.train.run.run_state import restore_params

    cfg = _load(args)
    wanted = None if args.step == "base" else _checkpoint_step(args.step)  # a bad --step fails before loading
    policy = load_policy(cfg.model.source)
    if args.step == "base":
        step, params = 0, policy.params
    else:
        step, params = restore_params(cfg, policy, wanted)
    result = evaluate_params(cfg, policy, params, samples=args.samples, step=step)
    print(json.dumps({"step": step, **result}, indent=2))
    return 0


def _export(args: argparse.Namespace) -> int:
    """W + alpha/r * A @ B for a LoRA run (full weights for a full fine-tuning run) -> HF directory."""
    from jaxrl_llm.bridge import save_hf_dir
    from jaxrl_llm.models.lora import spec_from_train_config
    from jaxrl_llm.train.policy import load_policy
    from jaxrl_llm.train.run.run_state import restore_params

    cfg = _load(args)
    if spec_from_train_config(cfg.train) is not None and not args.merged:
        raise UserError(f"export: this run trains LoRA adapters (train.lora_rank={cfg.train.lora_rank}); pass "
                        "--merged to write base + adapters as full weights (the adapters alone are in the "
                        "run's checkpoints)")
    wanted = _checkpoint_step(args.step)
    policy = load_policy(cfg.model.source)
    step, params = restore_params(cfg, policy, wanted)
    out = save_hf_dir(policy.cfg, params, args.out, dtype=args.dtype, tokenizer_dir=policy.model_dir)
    print(f"step {step} -> {out}")
    return 0


def _plot(args: argparse.Namespace) -> int:
    from jaxrl_llm.train.run.plots import plot_main

    return plot_main(args.rest)


def _bias_report(args: argparse.Namespace) -> int:
    from jaxrl_llm.reports import bias_report

    bias_report.run(args.out, recipes=tuple(args.recipes), seed=args.seed)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from jaxrl_llm.reports.demo import run_demo

    run_demo(_load(args), resume=args.resume)
    return 0


def _serve_tinker(args: argparse.Namespace) -> int:
    """Refusals (an open address without a key, a key the SDK would reject) are user errors."""
    try:
        from jaxrl_llm.serve.tinker.server import api_key_from_env, check_access, serve
    except ImportError as err:  # the `tinker` extra is missing
        raise UserError(f"serve-tinker needs the tinker SDK ({err}); valid: pip install -e '.[tinker]'") from err
    try:
        check_access(args.host, api_key_from_env(), args.dev)
    except ValueError as err:
        raise UserError(str(err)) from err
    budget = {} if args.micro_batch_tokens is None else {"micro_batch_tokens": args.micro_batch_tokens}
    if budget and args.micro_batch_tokens < 1:
        raise UserError(f"--micro-batch-tokens {args.micro_batch_tokens}; valid: >= 1 (padded tokens, rows x width)")
    serve(args.base_model, host=args.host, port=args.port, state_dir=args.state_dir, api_key=api_key_from_env(),
          dev=args.dev, seed=args.seed, **budget)
    return 0


def _compile(args: argparse.Namespace) -> int:
    """A config that does not fit the slice is a user error: one line (program, chip HBM, bytes needed), exit 2."""
    from jaxrl_llm.benchmarks.tpu.analysis import DoesNotFit, NotCompilable
    from jaxrl_llm.benchmarks.tpu.chips import LIBTPU_HINT
    from jaxrl_llm.benchmarks.tpu.compile_step import compile_step, provenance, write_json

    cfg = _load(args)
    print(f"compiling one RL step of {args.model or cfg.model.source} for {args.topology} (shapes only; "
          "times and roofline figures are estimates)", flush=True)
    try:
        result = compile_step(cfg, args.topology, model=args.model, num_layers=args.num_layers,
                              prompt_len=args.prompt_len, refuse=not args.report_all)
    except (DoesNotFit, NotCompilable) as err:
        raise UserError(str(err)) from None
    except ValueError as err:  # a bad --topology / --model / mesh size names the value and the valid ones
        raise UserError(str(err)) from None
    except RuntimeError as err:
        if LIBTPU_HINT in str(err):
            raise UserError(str(err)) from None
        raise
    if args.out:
        print(f"-> {write_json(args.out, {**provenance(), 'config': cfg.to_dict(), **result})}")
    if "step_estimate" in result:
        print(f"step estimate (roofline, not measured): {result['step_estimate']['seconds']:.2f} s")
    if not result["fits"]:
        raise UserError(f"the step does not fit {args.topology}: " + ", ".join(
            r["program"] for r in result["programs"] if not r["fits"]) + " need more HBM than a chip has")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (and exit status 2, as argparse's are)."""

    def error(self, message: str):
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="jaxrl", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

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

    comp = sub.add_parser("compile", help="compile one RL step for a TPU slice from shapes (docs/tpu.md)")
    config_args(comp)
    comp.add_argument("--topology", default="v5e-8", help="TPU slice, e.g. v4-8 v5e-8 v5e-256 v5p-8 v5p-64 v6e-8")
    comp.add_argument("--model", default=None,
                      help="a named shape (qwen2.5-1.5b, qwen2.5-7b, qwen2.5-32b, qwen3-30b-a3b); "
                           "default: model.source's config.json")
    comp.add_argument("--num-layers", type=int, default=None, help="fewer layers than the model's (quick looks)")
    comp.add_argument("--prompt-len", type=int, default=512, help="prompt tokens per sequence")
    comp.add_argument("--out", default=None, help="write the results JSON here")
    comp.add_argument("--report-all", action="store_true",
                      help="report every program even when one does not fit (still exits 2 then)")
    comp.set_defaults(func=_compile)

    tinker = sub.add_parser("serve-tinker", help="the Tinker API on the JAX learner and sampler (docs/tinker.md)")
    tinker.add_argument("--base-model", action="append", required=True,
                        help="a base model clients may name: 'smollm2', an HF directory or a .gguf (repeatable); "
                             "clients pass it as base_model exactly as written here")
    tinker.add_argument("--host", default="127.0.0.1", help="listen address (default loopback only)")
    tinker.add_argument("--port", type=int, default=8000)
    tinker.add_argument("--state-dir", default="runs/tinker_state", help="checkpoints (tinker://...) live here")
    tinker.add_argument("--dev", action="store_true",
                        help="no API key (loopback only); otherwise $JAXRL_TINKER_API_KEY (tml-...) is required")
    tinker.add_argument("--seed", type=int, default=0, help="LoRA init seed when a client gives none")
    tinker.add_argument("--micro-batch-tokens", type=int,
                        help="forward / forward_backward rows run in micro-batches of at most this many padded "
                             "tokens (rows x width, at least 4 rows); losses and gradients are summed "
                             "(default: serve/tinker/learner.py MICRO_BATCH_TOKENS)")
    tinker.set_defaults(func=_serve_tinker)
    return parser


def _one_line(err: BaseException) -> str:
    return " ".join((str(err).strip() or type(err).__name__).split())


def _configure_logging(debug: bool) -> None:
    """Library messages (logger "jaxrl_llm") to stderr; other libraries' loggers untouched."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[jaxrl] %(message)s"))
    lib = logging.getLogger("jaxrl_llm")
    lib.addHandler(handler)
    lib.propagate = False  # once, even if another library configured the root logger
    lib.setLevel(logging.DEBUG if debug else logging.INFO)


def _working_directory_importable() -> None:
    """Let a config name modules of the working directory (task.reward_fn="my_rewards:score",
    task.plugins, experiments.*), as `python -m` would; appended, so it shadows no package."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _working_directory_importable()
    _configure_logging(args.debug)
    if args.debug:
        return args.func(args)
    try:
        return args.func(args)
    except _user_error_types() as err:
        print(f"jaxrl {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
