"""Sampler-vs-learner log-prob offset trials (issue 35, part C).

Runs the multi-turn configuration of tests/train/test_episodes.py::
test_kill_9_then_resume_is_exact_for_a_multi_turn_run (tiny random decoder, JAX sampler,
ParityEnv with 2 turns, 4 steps, same seed) many times as `jaxrl train` subprocesses, two at
a time as that test does, under extra CPU load (busy-loop burner processes), for each of:

  devices   8 fake CPU devices (XLA_FLAGS --xla_force_host_platform_device_count=8, as in
            tests/conftest.py) or 1
  threads   XLA CPU's default (threaded Eigen matmuls) or single-threaded
            (--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1)

and records, per run and step, the mismatch metrics (core/corrections.py mismatch_metrics:
mismatch_k1 = mean over tokens of log mu - log pi_old, the sampler's minus the learner's
log-prob), and whether the run's model metrics equal the first run's of its condition bit for
bit. Writes a JSON summary (counts and sizes) to --out.

    PYTHONPATH=. nice -n 10 python jaxrl_llm/benchmarks/cpu/offset_trials.py --pairs 3 --out benchmarks/results/offset_trials.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
CONDITIONS = {
    "8dev-threaded": "--xla_force_host_platform_device_count=8",
    "8dev-single": "--xla_force_host_platform_device_count=8 --xla_cpu_multi_thread_eigen=false "
                   "intra_op_parallelism_threads=1",
    "1dev-threaded": "--xla_force_host_platform_device_count=1",
    "1dev-single": "--xla_force_host_platform_device_count=1 --xla_cpu_multi_thread_eigen=false "
                   "intra_op_parallelism_threads=1",
}
ARGS = ["rollout.engine=jax", "total_steps=4", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4",
        "train.micro_batch_size=4", "train.lr=1e-3", "checkpoint.every_steps=1", "checkpoint.async_save=false",
        "metrics.tensorboard=false", "task.eval_size=4", "task.eval_samples=2",
        "task.env=tests.train.episode_envs:ParityEnv", 'task.env_kwargs={"turns": 2}', "rollout.max_tokens=48",
        "task.turn_max_tokens=5", "task.max_turns=2"]
BURN = "import os\nos.nice(19)\nwhile True:\n    pass\n"
SKIP = {"time", "step"}


def tiny_model_dir(out: Path) -> str:
    """The tests' tiny random decoder (tests/train/test_loop.py tiny_model_dir), saved as an HF dir."""
    import jax

    from jaxrl_llm import bridge
    from jaxrl_llm.models.config import tiny_decoder_config
    from jaxrl_llm.models import init_params

    cfg = tiny_decoder_config()
    bridge.save_hf_dir(cfg, init_params(cfg, jax.random.key(0)), out, tokenizer_dir=bridge.smollm2_hf_dir())
    return str(out)


def start(model: str, run_dir: Path, xla_flags: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "XLA_FLAGS": xla_flags, "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "jaxrl_llm.cli", "train", "--config", str(REPO / "experiments/demo.py"), *ARGS,
           f"model.source={model}", f"run_dir={run_dir}"]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def summarize(rows: list[dict], reference: list[dict] | None) -> dict:
    k1 = [r["mismatch_k1"] for r in rows]
    out = {"steps": len(rows), "mismatch_k1": k1, "mismatch_k3": [r["mismatch_k3"] for r in rows],
           "max_abs_k1": max(abs(x) for x in k1),
           "prob_diff_max": max(max(abs(r["mismatch_prob_diff_max"]), abs(r["mismatch_prob_diff_min"])) for r in rows)}
    if reference is not None:
        diffs = {}
        for want, have in zip(reference, rows):
            for key in set(want) - SKIP - {k for k in want if k.startswith("time_") or k == "tokens_per_s"}:
                a, b = want[key], have.get(key)
                if a != b and not (a != a and b != b):  # NaN == NaN here
                    diffs[key] = max(diffs.get(key, 0.0), abs(float(a) - float(b)) if b is not None else float("inf"))
        out["equal_to_first_run"] = not diffs
        out["largest_differences"] = dict(sorted(diffs.items(), key=lambda kv: -kv[1])[:5])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="pairs of concurrent runs per condition")
    parser.add_argument("--burners", type=int, default=2, help="busy-loop processes (nice 19) during the runs")
    parser.add_argument("--conditions", default=",".join(CONDITIONS))
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/offset_trials.json"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="offset_trials_"))
    model = tiny_model_dir(work / "model")
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(args.burners)]
    results: dict[str, list[dict]] = {}
    try:
        for pair in range(args.pairs):
            for name in args.conditions.split(","):
                t0 = time.time()
                runs = [work / f"{name}-{pair}-{i}" for i in range(2)]
                procs = [start(model, run, CONDITIONS[name]) for run in runs]
                for run, proc in zip(runs, procs):
                    err = proc.communicate(timeout=1800)[1]
                    if proc.returncode:
                        raise SystemExit(f"{run}: exit {proc.returncode}\n{err[-3000:]}")
                    done = results.setdefault(name, [])
                    first = read_rows(work / f"{name}-0-0") if done else None
                    done.append({"run": run.name, "load_1min": os.getloadavg()[0], **summarize(read_rows(run), first)})
                    print(json.dumps(done[-1]), flush=True)
                print(f"{name} pair {pair}: {time.time() - t0:.0f} s", flush=True)
                write(args, results)
    finally:
        for b in burners:
            b.kill()
    print(json.dumps(write(args, results), indent=1))


def write(args: argparse.Namespace, results: dict[str, list[dict]]) -> dict:
    summary = {name: {"runs": len(rs), "differing_from_first_run": sum(not r.get("equal_to_first_run", True) for r in rs),
                      "max_abs_mismatch_k1": max(r["max_abs_k1"] for r in rs),
                      "runs_with_abs_k1_over_1e-3": sum(r["max_abs_k1"] > 1e-3 for r in rs)}
               for name, rs in results.items()}
    Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "burners": args.burners,
                                          "cpus": os.cpu_count(), "summary": summary, "runs": results}, indent=1))
    return summary


if __name__ == "__main__":
    main()
