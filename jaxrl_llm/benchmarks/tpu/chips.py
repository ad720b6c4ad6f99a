"""TPU slices by name (v5e-8, v5p-64, ...): their topology for JAX's deviceless compile, and the
chip's datasheet figures for the fit check and the roofline estimate.

Names are Cloud TPU accelerator types, as MaxText's ``accelerator_to_spec_map`` spells them: the
number counts TensorCores, so a v4-8 or v5p-8 is 4 chips (two cores per chip, run as one
"megacore" device), a v5e-8 or v6e-8 is 8 chips (one core each). Hosts hold 2x2x1 chips in
JAX's deviceless topologies (`jax.experimental.topologies.get_topology_desc`); slices of 64 chips
and more wrap into a torus.

Datasheet figures per chip (Google Cloud TPU documentation, cloud.google.com/tpu/docs/<v4|v5e|
v5p|v6e>): peak dense bf16 FLOP/s, HBM capacity and bandwidth, inter-chip interconnect (ICI)
bandwidth. HBM capacities are the ones a program must fit (v4 32 GiB, v5e 16, v5p 95, v6e 32).
"""
from __future__ import annotations

import re
from typing import NamedTuple

GIB = 1 << 30


class Chip(NamedTuple):
    """One TPU generation's chip (datasheet figures; see the module doc for the source)."""

    generation: str  # "v5e"
    topology_prefix: str  # the generation as JAX's topology names spell it ("v5e", "v5", "v6e", "v4")
    chip_config: str  # "default" (one core per chip) or "megacore" (two cores as one device)
    cores_per_chip: int
    hbm_bytes: int
    peak_bf16_flops: float  # FLOP/s
    hbm_bytes_per_s: float
    ici_bytes_per_s: float  # bidirectional, per chip
    source: str


CHIPS = {
    # v4: 275 TFLOP/s bf16, 32 GiB HBM2 at 1200 GB/s, ICI 2400 Gbps (cloud.google.com/tpu/docs/v4)
    "v4": Chip("v4", "v4", "megacore", 2, 32 * GIB, 275e12, 1200e9, 300e9, "cloud.google.com/tpu/docs/v4"),
    # v5e: 197 TFLOP/s bf16, 16 GB HBM2 at 819 GB/s, ICI 400 GB/s bidirectional (cloud.google.com/tpu/docs/v5e)
    "v5e": Chip("v5e", "v5e", "default", 1, 16 * GIB, 197e12, 819e9, 400e9, "cloud.google.com/tpu/docs/v5e"),
    # v5p: 459 TFLOP/s bf16, 95 GB HBM2e at 2765 GB/s, ICI 4800 Gbps (cloud.google.com/tpu/docs/v5p)
    "v5p": Chip("v5p", "v5", "megacore", 2, 95 * GIB, 459e12, 2765e9, 600e9, "cloud.google.com/tpu/docs/v5p"),
    # v6e: 918 TFLOP/s bf16, 32 GB HBM at 1638 GB/s, ICI 800 GB/s bidirectional (cloud.google.com/tpu/docs/v6e)
    "v6e": Chip("v6e", "v6e", "default", 1, 32 * GIB, 918e12, 1638e9, 800e9, "cloud.google.com/tpu/docs/v6e"),
}

# Chip grids of the slice sizes (chips) JAX's topologies take, 2D for v5e/v6e and 3D for v4/v5p.
_GRID_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16), 256: (16, 16)}
_GRID_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4), 128: (4, 4, 8),
            256: (4, 8, 8), 512: (8, 8, 8)}
NAME = re.compile(r"^(v4|v5e|v5p|v6e)-(\d+)$")


class Slice(NamedTuple):
    """A TPU slice: its name, chip, chip count and the arguments of JAX's deviceless topology."""

    name: str
    chip: Chip
    chips: int
    topology_name: str  # e.g. "v5e:2x4"
    chips_per_host_bounds: tuple[int, int, int]
    wrap: tuple[bool, bool, bool]


def known_names() -> list[str]:
    """Every slice name `parse_slice` accepts."""
    names = []
    for gen, chip in CHIPS.items():
        grids = _GRID_2D if chip.cores_per_chip == 1 else _GRID_3D
        names += [f"{gen}-{chips * chip.cores_per_chip}" for chips in grids]
    return names


def parse_slice(name: str) -> Slice:
    """The `Slice` a Cloud TPU accelerator type names (e.g. "v5e-8": 8 v5e chips in a 2x4 grid);
    ValueError naming the valid names otherwise."""
    match = NAME.match(name.strip().lower())
    chip = CHIPS.get(match.group(1)) if match else None
    grids = None if chip is None else (_GRID_2D if chip.cores_per_chip == 1 else _GRID_3D)
    chips = None if chip is None else int(match.group(2)) // chip.cores_per_chip
    if chip is None or int(match.group(2)) % chip.cores_per_chip or chips not in grids:
        raise ValueError(f"--topology {name!r} is not a known TPU slice; valid: {', '.join(known_names())}")
    grid = grids[chips]
    # a full 2D pod (256 chips) wraps in both dimensions; 3D slices of 64 chips and more wrap in all three
    if len(grid) == 2:
        wrap = (grid[0] >= 16, grid[1] >= 16, False)
        bounds = (min(2, grid[0]), min(2, grid[1]), 1)
        grid_text = f"{grid[0]}x{grid[1]}"
    else:
        wrap = (chips >= 64,) * 3
        bounds = (min(2, grid[0]), min(2, grid[1]), 1)
        grid_text = "x".join(map(str, grid))
    return Slice(name, chip, chips, f"{chip.topology_prefix}:{grid_text}", bounds, wrap)


LIBTPU_HINT = ("the TPU compiler (libtpu) is not installed: run `make venv` (it puts libtpu in .venv/libtpu), "
               "or pip install -e '.[tpu]'")
LIBTPU_DIR = "libtpu"  # under the virtualenv (sys.prefix): where `make venv` installs libtpu, off sys.path


def libtpu_path() -> str | None:
    """The libtpu shared library: $TPU_LIBRARY_PATH, an importable ``libtpu`` (the `tpu` extra), or
    `make venv`'s copy in <venv>/libtpu, kept off sys.path so that JAX on CPU or GPU never loads it."""
    import importlib.util
    import os
    import sys

    env = os.environ.get("TPU_LIBRARY_PATH")
    if env and os.path.isfile(env):
        return env
    spec = importlib.util.find_spec("libtpu")
    candidates = [os.path.join(p, "libtpu.so") for p in (spec.submodule_search_locations or [])] if spec else []
    candidates.append(os.path.join(sys.prefix, LIBTPU_DIR, "libtpu", "libtpu.so"))
    return next((c for c in candidates if os.path.isfile(c)), None)


def libtpu_version() -> str | None:
    """The version of the libtpu `libtpu_path` finds (its wheel's dist-info beside it), None if none."""
    import glob
    import os

    path = libtpu_path()
    if path is None:
        return None
    infos = glob.glob(os.path.join(os.path.dirname(os.path.dirname(path)), "libtpu-*.dist-info"))
    return os.path.basename(infos[0])[len("libtpu-"):-len(".dist-info")] if infos else "unknown"


def slice_devices(spec: Slice) -> list:
    """The deviceless TPU devices of a slice (JAX's topology description; no TPU needed): ordered
    as JAX lists them. RuntimeError with `LIBTPU_HINT` when libtpu is missing."""
    import os

    path = libtpu_path()
    if path is None:
        raise RuntimeError(LIBTPU_HINT)
    os.environ.setdefault("TPU_LIBRARY_PATH", path)
    # No TPU VM here: no metadata server to ask and no workers to find. Saying so keeps libtpu's
    # start-up from querying the network and printing warnings; the topology itself comes from
    # get_topology_desc's arguments, not from these.
    for key, value in (("TPU_SKIP_MDS_QUERY", "1"), ("TPU_WORKER_HOSTNAMES", "localhost"), ("TPU_WORKER_ID", "0"),
                       ("TPU_ACCELERATOR_TYPE", "v5litepod-4")):
        os.environ.setdefault(key, value)
    # Several processes (pytest workers, make test's lanes) may load libtpu at once; its lock file
    # refuses the second unless told otherwise. Nothing here runs on a TPU, so sharing is safe.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "true")
    from jax.experimental import topologies

    topology = topologies.get_topology_desc(
        platform="tpu", topology_name=spec.topology_name, chip_config_name=spec.chip.chip_config,
        chips_per_host_bounds=spec.chips_per_host_bounds, num_slices=1, wrap=spec.wrap)
    devices = list(topology.devices)
    if len(devices) != spec.chips:
        raise RuntimeError(f"{spec.name}: JAX's topology {spec.topology_name} has {len(devices)} devices, "
                           f"expected {spec.chips} chips")
    return devices
