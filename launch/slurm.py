"""SLURM cluster: an sbatch script that runs launch/single_node.py once per node.

    python launch/slurm.py --config experiments/demo.py --model-dir /data/Qwen2.5-7B \
        --nodes 4 --gpus-per-node 8 --learner-gpus 0-3 --rollout-gpus 4-7 \
        [--partition gpu] [--time 24:00:00] [--dry-run] [-- overrides...]

Layout: one SLURM task per node. On every node the task starts its vLLM servers on the
rollout GPUs (bound to 127.0.0.1, one port each) and one JAX learner process on the
learner GPUs; the learner processes of all nodes form one multi-host JAX job:
`train.distributed.initialize_from_env` reads SLURM_NTASKS / SLURM_PROCID and uses the
first node of the step as coordinator (port JAXRL_COORDINATOR_PORT), and the global mesh
(mesh.* in the config) spans nodes x learner GPUs.

--dry-run prints the sbatch script and the `sbatch` command; otherwise the script is
written to --script-out and submitted.
"""
from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import parse_ids  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--model-dir", required=True, help="HF directory on shared storage")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--learner-gpus", default="0-3")
    p.add_argument("--rollout-gpus", default="4-7")
    p.add_argument("--gpus-per-server", type=int, default=1)
    p.add_argument("--cpus-per-task", type=int, default=32)
    p.add_argument("--partition", default=None)
    p.add_argument("--account", default=None)
    p.add_argument("--time", default="24:00:00")
    p.add_argument("--job-name", default="jaxrl")
    p.add_argument("--coordinator-port", type=int, default=12355)
    p.add_argument("--python", default="python", help="learner interpreter on the nodes")
    p.add_argument("--vllm-python", default="python", help="CUDA vLLM interpreter on the nodes")
    p.add_argument("--workdir", default=".", help="repository checkout on shared storage")
    p.add_argument("--script-out", default="runs/slurm/job.sbatch")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("overrides", nargs="*")
    return p


def sbatch_script(args: argparse.Namespace) -> str:
    if args.nodes < 1:
        raise SystemExit(f"--nodes={args.nodes} is invalid; valid: >= 1")
    used = parse_ids(args.learner_gpus, "learner-gpus") + parse_ids(args.rollout_gpus, "rollout-gpus")
    if max(used) >= args.gpus_per_node:
        raise SystemExit(f"GPU id {max(used)} does not exist with --gpus-per-node={args.gpus_per_node}; "
                         f"valid ids: 0..{args.gpus_per_node - 1}")
    header = [f"#SBATCH --job-name={args.job_name}", f"#SBATCH --nodes={args.nodes}", "#SBATCH --ntasks-per-node=1",
              f"#SBATCH --gpus-per-node={args.gpus_per_node}", f"#SBATCH --cpus-per-task={args.cpus_per_task}",
              f"#SBATCH --time={args.time}", "#SBATCH --output=runs/slurm/%x-%j.out", "#SBATCH --exclusive"]
    if args.partition:
        header.append(f"#SBATCH --partition={args.partition}")
    if args.account:
        header.append(f"#SBATCH --account={args.account}")
    node_cmd = [args.python, "launch/single_node.py", "--config", args.config, "--model-dir", args.model_dir,
                "--learner-gpus", args.learner_gpus, "--rollout-gpus", args.rollout_gpus,
                "--gpus-per-server", str(args.gpus_per_server), "--python", args.python,
                "--vllm-python", args.vllm_python, "--log-dir", "runs/slurm/${SLURM_JOB_ID}/node_${SLURM_PROCID}"]
    body = [
        "set -euo pipefail",
        f"cd {shlex.quote(args.workdir)}",
        f"export JAXRL_COORDINATOR_PORT={args.coordinator_port}",
        # single quotes: SLURM_PROCID must expand inside each task, not in the batch shell.
        "srun --kill-on-bad-exit=1 --ntasks-per-node=1 bash -c "
        + shlex.quote(" ".join(shlex.quote(a) if "$" not in a else f'"{a}"' for a in node_cmd)
                      + (" " + shlex.join(args.overrides) if args.overrides else "")),
    ]
    return "\n".join(["#!/bin/bash", *header, "", *body]) + "\n"


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    script = sbatch_script(args)
    if args.dry_run:
        print(script, end="")
        print(f"# submit: sbatch {shlex.quote(args.script_out)}")
        return 0
    out = Path(args.script_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(script)
    return subprocess.call(["sbatch", str(out)])


if __name__ == "__main__":
    raise SystemExit(main())
