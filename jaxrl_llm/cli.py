"""The commands a user types: `python -m jaxrl_llm.cli <command> ...` (or `jaxrl <command>`).

  demo          the main job (`make demo`)
  bias-report   the length- and difficulty-bias report of each recipe (table + PNGs)
"""
from __future__ import annotations

import argparse
import sys


def _bias_report(args: argparse.Namespace) -> int:
    from jaxrl_llm.reports import bias_report

    bias_report.run(args.out, recipes=tuple(args.recipes), seed=args.seed)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from jaxrl_llm.reports import bias_report

    bias_report.run(f"{args.out}/bias", seed=0)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxrl", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="the main job (make demo)")
    demo.add_argument("--out", default="runs/demo", help="output directory (default: runs/demo)")
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
