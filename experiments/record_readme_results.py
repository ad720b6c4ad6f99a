"""Results files for the experiments whose numbers exist only in experiments/README.md.

    python experiments/record_readme_results.py [NAME ...]   # default: every experiment below

The runs behind these numbers are gone (runs/ is not committed), so each file is written from
the numbers recorded in experiments/README.md at commit README_COMMIT, marked as such
("re-run pending"). The verdict is still computed: each experiment file's `rule_verdict`
applied to the recorded numbers. A deciding re-run (`--results`) replaces the file.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxrl_llm.reports.results import ExperimentResult, experiment_module, write_result  # noqa: E402

README_COMMIT = "f035540"
SOURCE = f"recorded from the README at {README_COMMIT}; re-run pending"
NAN = math.nan
XEON = {"cpu": "Intel Xeon (2 cores, shared)"}


def iv(mean: float, low: float = NAN, high: float = NAN, n: int = 1) -> dict:
    return {"mean": mean, "low": low, "high": high, "n": n}


def welch(a: dict, b: dict) -> dict:
    """The unpaired difference a - b with Welch's 95% interval, from two recorded Student-t
    intervals (each seed's spread recovered from its half-width): what recorded means allow
    when the per-seed numbers are gone."""
    from scipy import stats

    def var_of_mean(x):
        return ((x["high"] - x["low"]) / 2 / stats.t.ppf(0.975, x["n"] - 1)) ** 2

    va, vb = var_of_mean(a), var_of_mean(b)
    df = (va + vb) ** 2 / (va ** 2 / (a["n"] - 1) + vb ** 2 / (b["n"] - 1))
    half = stats.t.ppf(0.975, df) * math.sqrt(va + vb)
    mean = a["mean"] - b["mean"]
    return iv(mean, mean - half, mean + half, min(a["n"], b["n"]))


def recorded() -> dict[str, dict]:
    """{name: the fields of its ExperimentResult but the verdict and the experiment's own texts}."""
    grpo, dr = iv(-13.6, -19.2, -8.0, 3), iv(-4.5, -21.2, 12.1, 3)
    return {
        "length_bias": dict(
            title="length bias, length-dependent reward (SmolLM2-135M, 1-digit addition)",
            setting="full size: 16 steps x 8 prompts x 8 samples, max 32 tokens, lr 2e-5, fp32, JAX sampler",
            command="python experiments/length_bias.py", seeds=(0, 1, 2),
            statistic="GRPO - Dr. GRPO change in mean incorrect length; recorded unpaired (the per-seed numbers "
                      "are gone)",
            interval_method="Welch 95% interval of the unpaired difference, from the recorded per-recipe Student-t "
                            "intervals (n = 3 each)",
            headline="grpo - dr_grpo d length_incorrect",
            numbers={"grpo - dr_grpo d length_incorrect": welch(grpo, dr), "grpo d length_incorrect": grpo,
                     "dr_grpo d length_incorrect": dr, "dapo d length_incorrect": iv(-11.7, -19.7, -3.8, 3)},
            wall_s=5004.0, machine=XEON),
        "precision_mismatch": dict(
            title="precision mismatch (vLLM CPU and JAX sampler x learner, fp32/bf16/fp16)",
            setting="--quick: 8 prompts x 4 samples, <= 64 tokens, temperature 1, SmolLM2-135M",
            command="python experiments/precision_mismatch.py --quick seed=S (S = 0, 1, 2)", seeds=(0, 1, 2),
            statistic="k3 per token, bf16 / fp16 ratio of matched sampler-learner pairs",
            interval_method="recorded: linear Student-t on the ratio over 3 seeds (the rule's log-scale interval "
                            "needs the per-seed ratios: re-run pending)",
            headline="vllm k3 bf16/fp16",
            numbers={"vllm k3 bf16/fp16": iv(66, 52, 81, 3), "jax k3 bf16/fp16": iv(90, 65, 115, 3),
                     "vllm k1 bf16/fp16, full size": iv(22.7), "vllm k3 bf16/fp16, full size": iv(55.5)},
            wall_s=757.0, wall_note="3 seeds, 4 min 30 s + 4 min 8 s + 3 min 59 s", machine=XEON),
        "difficulty_bias": dict(
            title="difficulty bias (analytic + real groups)",
            setting="96 logged groups of G = 8 from experiment 1's --quick runs", seeds=(0,),
            command="python experiments/difficulty_bias.py --quick",
            statistic="measured vs closed-form E|A| per group; gradient share with / without the std normaliser",
            interval_method="none: an identity on logged groups (no seed noise)",
            headline="gradient share with / without std, p = 1/8",
            numbers={"max |measured - closed form| E|A|": iv(1.8e-6, n=96),
                     "gradient share with / without std, p = 1/8": iv(1.31, n=3),
                     "gradient share with / without std, p = 7/8": iv(1.17, n=21)},
            wall_s=5.0, machine=XEON),
        "sanity_check": dict(
            title="sanity check (fp32 / bf16 / fp16)",
            setting="full size: 3 precisions x 20 steps x 8 prompts x 8 samples, SmolLM2-135M, 1-digit addition",
            command="python experiments/sanity_check.py", seeds=(0, 1, 2),
            statistic="share of runs whose step reward reaches >= 0.9; mean reward of the last 5 steps",
            interval_method="mean and 95% Student-t over seeds", headline="share of runs reaching reward >= 0.9",
            numbers={"share of runs reaching reward >= 0.9": iv(1.0, n=9), "fp16 updates skipped": iv(0.0, n=3),
                     "fp32 reward, last 5 steps": iv(0.966, 0.904, 1.03, 3),
                     "bf16 reward, last 5 steps": iv(0.904, 0.774, 1.03, 3),
                     "fp16 reward, last 5 steps": iv(0.883, 0.709, 1.06, 3)},
            wall_s=4816.0, machine=XEON),
        "length_neutral": dict(
            title="length bias, length-neutral format, SmolLM2-135M",
            setting="3 recipes x 3 steps x 2 prompts x 8 samples, 96 tokens", seeds=(0, 1, 2, 3, 4),
            command="python experiments/length_neutral.py --seeds 0,1,2,3,4",
            statistic="paired GRPO - Dr. GRPO length change (step 3 minus step 1), incorrect and correct",
            interval_method="mean and 95% Student-t over seeds, paired by seed",
            headline="grpo - dr_grpo length_incorrect",
            numbers={"grpo - dr_grpo length_incorrect": iv(-13.2, -35.2, 8.8, 5),
                     "grpo - dr_grpo length_correct": iv(-12.3, -22.7, -2.0, 5)},
            wall_s=1213.0, machine=XEON,
            notes=("The correct half's resolved fall (-12.3) comes with a fall of the same size in the incorrect "
                   "half (-13.2): both classes got shorter under GRPO, so it is no reproduction of the claimed split.",)),
        "chain_of_thought": dict(
            title="chain-of-thought setting (GPU config; CPU code-path check)",
            setting="--quick: 2 recipes x 2 steps x 2 prompts x 4 samples, 64 tokens", seeds=(0,),
            command="python experiments/chain_of_thought.py --quick", statistic="none (reward 0 in every sample)",
            interval_method="none", headline="", numbers={}, wall_s=81.3,
            machine={"cpu": "2-core CPU (shared, load 4.8)"}),
    }


def main(argv: list[str] | None = None) -> int:
    table = recorded()
    names = (argv if argv is not None else sys.argv[1:]) or list(table)
    for name in names:
        fields = dict(table[name])
        machine = fields.pop("machine")
        module = experiment_module(name)
        result = ExperimentResult(name=name, claim=module.CLAIM, verdict_rule=module.VERDICT_RULE,
                                  verdict=module.rule_verdict(fields["numbers"]), source=SOURCE, **fields)
        path = write_result(result, provenance={"commit": None, "dirty": None, "machine": machine,
                                                "date": "2026-11-23..26 (see experiments/README.md)"})
        print(f"{path}: {result.verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
