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
