"""Helpers of the experiments tests: the reduced run size, loading an experiments/<name>.py
file as a module, and the shape of a written PNG."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY = ["rollout.prompts_per_step=2", "rollout.samples_per_prompt=4", "rollout.max_tokens=6",
        "train.micro_batch_size=4", "train.lr=1e-3", "total_steps=2", "checkpoint.every_steps=1"]


def load_experiment(name: str):
    """experiments/<name>.py as a module; its sibling base_configs.py imports as it does when
    the file runs as a script (experiments/ on sys.path)."""
    if str(REPO / "experiments") not in sys.path:
        sys.path.insert(0, str(REPO / "experiments"))
    spec = importlib.util.spec_from_file_location(f"experiment_{name}", REPO / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def png_shape(path: Path) -> tuple[int, ...]:
    import matplotlib.image

    return matplotlib.image.imread(path).shape
