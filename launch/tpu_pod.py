"""Cloud TPU pod slice: the same training command on every worker VM via gcloud.

    python launch/tpu_pod.py --tpu my-v5p-64 --zone us-east5-a --project my-proj \
        --config experiments/demo.py [--rollout jax|vllm-tpu] [--setup] [--dry-run] [-- overrides...]

Every worker runs one JAX process (`gcloud compute tpus tpu-vm ssh --worker=all`);
JAXRL_DISTRIBUTED=tpu makes `train.distributed.initialize_from_env` call
`jax.distributed.initialize()` with no arguments, which reads the slice's topology
from the TPU metadata, and the mesh in the config spans every chip of the slice.

Rollouts:
  --rollout jax       (default) the built-in JAX sampler on the same chips: no second engine.
                      Without rollout.mesh it decodes from the learner's FSDP shards and
                      gathers every weight at every decode step (Qwen2.5-1.5B on v5e-8:
                      2.2 GB per step, docs/benchmarks.md); add the overrides
                      rollout.mesh.data=D rollout.mesh.tensor=T (D x T = one worker's chips)
                      for its own tensor-parallel layout, the weights copied into it once
                      per version and none gathered per step.
  --rollout vllm-tpu  a second TPU VM (--rollout-tpu, single host) runs vLLM's TPU build
                      (`pip install vllm-tpu`) bound to 127.0.0.1; every learner worker
                      first opens an SSH tunnel to it (`gcloud ... ssh -- -f -N -L`, run ON
                      the worker: needs gcloud auth there, the VM's service account by
                      default), so the dev endpoints are never exposed off-host. Weight sync needs a
                      filesystem both VMs mount (--shared-dir, e.g. a Filestore/GCS-fuse
                      path) because DiskWeightSync writes safetensors there.
--setup prepends an install step (the checkout with its `tpu` extra: jax[tpu] at the project's jax) on every worker.
"""
from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import learner_command  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tpu", required=True, help="TPU VM (slice) name")
    p.add_argument("--zone", required=True)
    p.add_argument("--project", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--repo-dir", default="~/jaxrl_llm", help="checkout on every worker")
    p.add_argument("--python", default="python3")
    p.add_argument("--rollout", choices=["jax", "vllm-tpu"], default="jax")
    p.add_argument("--rollout-tpu", default=None, help="single-host TPU VM for vLLM (with --rollout vllm-tpu)")
    p.add_argument("--model-dir", default=None, help="HF directory vLLM serves (with --rollout vllm-tpu)")
    p.add_argument("--tensor-parallel", type=int, default=4, help="vLLM tensor parallel size (chips of the VM)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--setup", action="store_true")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("overrides", nargs="*")
    return p


def ssh(args: argparse.Namespace, tpu: str, worker: str, remote: str, extra: list[str] | None = None) -> list[str]:
    cmd = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", tpu, f"--zone={args.zone}", f"--project={args.project}",
           f"--worker={worker}", f"--command={remote}"]
    return cmd + (["--", *extra] if extra else [])


def plan(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """(role, command) in launch order; a role ending in '&' runs in the background."""
    steps: list[tuple[str, list[str]]] = []
    if args.setup:
        # the tpu extra: jax[tpu] pinned to the project's jax (libtpu from PyPI), as `jaxrl compile` used it
        steps.append(("setup", ssh(args, args.tpu, "all", f"cd {args.repo_dir} && {args.python} -m pip install "
                                   "-e '.[tpu]'")))
    urls: list[str] = []
    if args.rollout == "vllm-tpu":
        if not args.rollout_tpu or not args.model_dir:
            raise SystemExit("--rollout vllm-tpu needs --rollout-tpu NAME and --model-dir DIR "
                             "(the HF directory vLLM serves, on storage that VM mounts)")
        serve = shlex.join(["env", "VLLM_SERVER_DEV_MODE=1", "vllm", "serve", args.model_dir,
                            "--served-model-name", "policy", "--host", "127.0.0.1", "--port", str(args.port),
                            "--tensor-parallel-size", str(args.tensor_parallel), "--logprobs-mode",
                            "processed_logprobs", "--generation-config", "vllm"])
        steps.append(("vllm-server &", ssh(args, args.rollout_tpu, "0", serve)))
        urls = [f"http://127.0.0.1:{args.port}"]
    engine = "jax" if args.rollout == "jax" else "vllm"
    train = learner_command(args.python, args.config, args.overrides, urls, engine=engine,
                            model_dir=args.model_dir if args.rollout == "vllm-tpu" else None)
    remote = f"cd {args.repo_dir} && JAXRL_DISTRIBUTED=tpu " + shlex.join(train)
    if args.rollout == "vllm-tpu":
        # Each learner worker forwards its own 127.0.0.1:port to the rollout VM's loopback
        # server over SSH (-f: in the background once connected), so nothing listens off-host.
        tunnel = ssh(args, args.rollout_tpu, "0", "true", ["-f", "-N", "-L", f"{args.port}:127.0.0.1:{args.port}"])
        wait = f"until curl -sf http://127.0.0.1:{args.port}/health; do sleep 5; done"
        remote = shlex.join(tunnel) + " && " + wait + " && " + remote
    steps.append(("learner", ssh(args, args.tpu, "all", remote)))
    return steps


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    steps = plan(args)
    if args.dry_run:
        for role, cmd in steps:
            print(shlex.join(cmd) + (" &" if role.endswith("&") else ""))
        return 0
    background = []
    try:
        for role, cmd in steps:
            if role.endswith("&"):
                background.append(subprocess.Popen(cmd))
            elif subprocess.call(cmd) != 0:
                return 1
        return 0
    finally:
        for proc in background:
            proc.terminate()


if __name__ == "__main__":
    raise SystemExit(main())
