"""The PyTorch side of ``benchmarks.cpu.model``: transformers' model of a checkpoint directory, timed in a
child process of its own.

JAX and torch in one process took 9.3-9.5 GB at 8x512 and 2x2048 (over the 9 GB a process may
use on the shared benchmark machine), and each one's memory could not be told apart. The parent
(JAX) process starts ``TorchWorker``, which runs this module; requests go one at a time over a
pipe, so the engines still take turns and never compute at once. This module imports no JAX.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, TextIO

import numpy as np


def peak_rss_bytes() -> int:
    """This process's peak resident set size since start or the last ``reset_peak_rss`` (VmHWM)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmHWM line")


def reset_peak_rss() -> None:
    """Set VmHWM to the current RSS (Linux >= 4.0: write 5 to /proc/self/clear_refs)."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def torch_step(model, tokens: np.ndarray, threads: int, result: dict, device: str = "cpu") -> Callable[[], None]:
    """The same loss with transformers' model, forward+backward, on ``threads`` OpenMP threads (CPU) or
    on the GPU (``device="cuda"``; ``threads`` unused), returning once every kernel has finished."""
    import torch

    batch = torch.tensor(tokens, dtype=torch.long, device=device)

    def run():
        if device == "cpu":
            torch.set_num_threads(threads)
        model.zero_grad(set_to_none=True)
        logits = model(batch).logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, batch[:, 1:, None])[..., 0]
        loss = -logp.mean()
        loss.backward()
        if device != "cpu":
            torch.cuda.synchronize()
        result["loss"] = float(loss.detach())

    return run


def serve_torch(hf_dir: str, requests: TextIO, replies: TextIO, device: str = "cpu") -> None:
    """Answers one JSON line per JSON request line until the end of input:
    {"dtype", "tokens"}: load the model in that dtype (kept while the dtype stays) and this batch,
    reset the peak RSS -> {"pid"}; {"threads"}: one forward+backward on that many threads ->
    {"loss"}; {"peak_rss": true} -> {"peak_rss": bytes since the last load}."""
    import torch
    from transformers import AutoModelForCausalLM

    model, dtype, steps, result = None, None, {}, {}
    for line in requests:
        request = json.loads(line)
        if "dtype" in request:
            if request["dtype"] != dtype:
                model, dtype = None, request["dtype"]
                model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
                model = model.to(device, getattr(torch, dtype))
                model.train()
            tokens = np.asarray(request["tokens"], np.int64)
            steps = {}
            reset_peak_rss()
            reply = {"pid": os.getpid()}
        elif "threads" in request:
            threads = int(request["threads"])
            steps.setdefault(threads, torch_step(model, tokens, threads, result, device))()
            reply = {"loss": result["loss"]}
        else:
            reply = {"peak_rss": peak_rss_bytes()}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


class TorchWorker:
    """A child process running ``serve_torch`` on the transformers checkpoint ``hf_dir``; the parent
    (JAX) process sends it one request at a time, so the two never compute at once. ``device``: where
    torch runs, "cpu" or "cuda"."""

    def __init__(self, hf_dir: str, device: str = "cpu"):
        root = str(Path(__file__).resolve().parents[3])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        self.process = subprocess.Popen([sys.executable, "-m", "jaxrl_llm.benchmarks.cpu.torch_worker", hf_dir, device],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def ask(self, **request) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"torch worker (pid {self.process.pid}) ended with exit code {self.process.wait()} "
                               f"on request {list(request)}; its stderr is above")
        return json.loads(line)

    def load(self, dtype: str, tokens: np.ndarray) -> int:
        """The model in ``dtype``, the batch ``tokens``; resets the worker's peak RSS; returns its pid."""
        return self.ask(dtype=dtype, tokens=tokens.tolist())["pid"]

    def step_fn(self, threads: int, result: dict) -> Callable[[], None]:
        """One forward+backward in the worker on ``threads`` threads; its loss lands in result["loss"]."""
        def run():
            result["loss"] = self.ask(threads=threads)["loss"]
        return run

    def peak_rss(self) -> int:
        return self.ask(peak_rss=True)["peak_rss"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()

    def __enter__(self) -> "TorchWorker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv=None) -> None:
    """``python -m jaxrl_llm.benchmarks.cpu.torch_worker HF_DIR [cpu|cuda]``: serves requests from stdin,
    replies on the real stdout; anything else printed (library warnings) goes to stderr."""
    hf_dir, *device = sys.argv[1:] if argv is None else argv
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve_torch(hf_dir, sys.stdin, replies, *device)


if __name__ == "__main__":
    main()
