"""One GPU node: the learner on some GPUs, vLLM servers on the others.

    python launch/single_node.py --config experiments/demo.py --model-dir /data/Qwen2.5-1.5B \
        --learner-gpus 0-3 --rollout-gpus 4-7 [--gpus-per-server 1] [--dry-run] [-- overrides...]

Each vLLM server sees only its GPUs (CUDA_VISIBLE_DEVICES), binds to 127.0.0.1 on its
own port (--base-port + i), and the learner (`jaxrl_llm.cli train`, a JAX process over
the learner GPUs, mesh from the config) gets every server URL: the client spreads
requests round-robin over them and reloads weights on all of them. Without --dry-run the
script starts the servers, waits for /health, runs the learner, and stops the servers.

Inside a SLURM task (launch/slurm.py) the same script runs once per node; the learner
process then joins the multi-host JAX job through `train.distributed.initialize_from_env`.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import VLLM_UNSET, learner_command, parse_ids, run_servers_then_learner, shell_line, vllm_servers  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="experiment file (experiments/*.py) or config.json")
    p.add_argument("--model-dir", required=True, help="HF directory the vLLM servers start from")
    p.add_argument("--learner-gpus", default="0", help="GPU ids for the JAX learner, e.g. 0-3")
    p.add_argument("--rollout-gpus", default="1", help="GPU ids for vLLM servers, e.g. 4-7")
    p.add_argument("--gpus-per-server", type=int, default=1, help="tensor-parallel size of each server")
    p.add_argument("--base-port", type=int, default=8000)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--python", default=sys.executable, help="interpreter of the learner (this repo's venv)")
    p.add_argument("--vllm-python", default=os.environ.get("JAXRL_VLLM_PYTHON", "python"),
                   help="interpreter of a CUDA vLLM environment (default $JAXRL_VLLM_PYTHON)")
    p.add_argument("--log-dir", default="runs/launch_logs")
    p.add_argument("--startup-timeout-s", type=float, default=900.0)
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("overrides", nargs="*", help="dotted config overrides for the learner, e.g. train.lr=1e-6")
    return p


def plan(args: argparse.Namespace):
    learner_gpus = parse_ids(args.learner_gpus, "learner-gpus")
    rollout_gpus = parse_ids(args.rollout_gpus, "rollout-gpus")
    shared = sorted(set(learner_gpus) & set(rollout_gpus))
    if shared:
        raise SystemExit(f"GPUs {shared} are in both --learner-gpus and --rollout-gpus; give each GPU one role")
    servers = vllm_servers(args.model_dir, rollout_gpus, gpus_per_server=args.gpus_per_server,
                           base_port=args.base_port, python=args.vllm_python, dtype=args.dtype,
                           max_model_len=args.max_model_len, gpu_memory_utilization=args.gpu_memory_utilization,
                           seed=args.seed)
    # JAX preallocates 75% of each visible GPU by default; the learner owns its GPUs alone.
    learner_env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, learner_gpus)), "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}
    cmd = learner_command(args.python, args.config, args.overrides, [url for _, _, url in servers],
                          model_dir=args.model_dir)
    return servers, learner_env, cmd


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    servers, learner_env, cmd = plan(args)
    if args.dry_run:
        for env, server_cmd, _ in servers:
            print(shell_line(env, server_cmd, unset=VLLM_UNSET) + " &")
        print(shell_line(learner_env, cmd))
        return 0
    return run_servers_then_learner(servers, learner_env, cmd, log_dir=Path(args.log_dir),
                                    startup_timeout_s=args.startup_timeout_s)


if __name__ == "__main__":
    raise SystemExit(main())
