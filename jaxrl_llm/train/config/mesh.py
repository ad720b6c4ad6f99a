"""The device mesh section of a run's config (`Config.mesh`, re-exported by train/config/schema.py)."""

from __future__ import annotations

import dataclasses

from jaxrl_llm.utils.typed_config import ConfigError, Section, field


@dataclasses.dataclass(frozen=True)
class MeshConfig(Section):
    """Device mesh axis sizes; -1 on at most one axis means "all remaining devices".

    The default shards parameters, gradients and optimiser state over every device
    (fsdp; ZeRO-3 style) rather than replicating them (data): replication multiplies
    memory by the device count, which on 8 fake CPU devices alone is ~14 GB for a
    135M-parameter model with Adam.
    """

    data: int = field(1, ge=-1)
    fsdp: int = field(-1, ge=-1)
    tensor: int = field(1, ge=-1)
    _path_prefix = "mesh."

    def _check_consistency(self) -> None:
        sizes = dataclasses.asdict(self)
        zero = [k for k, v in sizes.items() if v == 0]
        if zero:
            raise ConfigError(f"mesh.{zero[0]} = 0; valid: a positive axis size or -1 (all remaining devices)")
        fill = [k for k, v in sizes.items() if v == -1]
        if len(fill) > 1:
            raise ConfigError(
                f"mesh axes {', '.join('mesh.' + k for k in fill)} are all -1; at most one axis may be -1"
            )


@dataclasses.dataclass(frozen=True)
class SamplerMeshConfig(Section):
    """The JAX sampler's own mesh, `rollout.mesh` (rollout/sampler_mesh.py): decode rows split over "data",
    attention heads, MLP width and vocabulary over "tensor" (Megatron tensor parallelism), over this
    process's devices, apart from the learner's `mesh`. The learner's weights are copied into that
    layout once per weight version.

    Rule: both unset (the default): the sampler decodes in the layout its weights arrive in (with a learner
    mesh, the learner's FSDP shards: every decode step then gathers every weight). One set: the other
    takes the devices it leaves (-1). At most one may be -1; data x tensor must equal the devices of a process.
    """

    data: int | None = field(None, ge=-1)
    tensor: int | None = field(None, ge=-1)
    _path_prefix = "rollout.mesh."

    @property
    def enabled(self) -> bool:
        return self.data is not None or self.tensor is not None

    def sizes(self) -> tuple[int, int]:
        """(data, tensor) with an unset axis as -1 (the devices the other leaves)."""
        return (-1 if self.data is None else self.data), (-1 if self.tensor is None else self.tensor)

    def _check_consistency(self) -> None:
        for name, value in (("data", self.data), ("tensor", self.tensor)):
            if value == 0:
                raise ConfigError(f"rollout.mesh.{name} = 0; valid: a positive axis size, -1 (the devices the "
                                  "other axis leaves) or unset")
        if self.data == -1 and self.tensor in (None, -1):
            raise ConfigError(f"rollout.mesh.data = -1 with rollout.mesh.tensor = {self.tensor}: at most one axis may "
                              "take the devices left; valid: a positive size on one of them, e.g. "
                              "rollout.mesh.tensor=4")
        if self.tensor == -1 and self.data is None:
            raise ConfigError("rollout.mesh.tensor = -1 with rollout.mesh.data unset: at most one axis may take the "
                              "devices left; valid: a positive size on one of them, e.g. rollout.mesh.data=1")
