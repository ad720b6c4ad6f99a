"""A run's configuration: the schema (`schema.py`) and its sections (`mesh`, `recipe`, `distill`,
`task`), and the cross-field checks every `Config` runs (`checks.py`). The names below are the
public API: `from jaxrl_llm.train.config import Config, TrainConfig, load_config`."""
from jaxrl_llm.train.config.schema import (
    PRECISION_DTYPES, CheckpointConfig, Config, ConfigError, CriticConfig, DistillConfig, MeshConfig, MetricsConfig,
    ModelConfig, RecipeConfig, RolloutConfig, ShapingConfig, TaskConfig, TrainConfig, VinePPOConfig, apply_overrides,
    config_from_dict, load_config, load_config_json, parse_overrides, replace_values, save_config, schema_help)

__all__ = [
    "PRECISION_DTYPES", "CheckpointConfig", "Config", "ConfigError", "CriticConfig", "DistillConfig", "MeshConfig",
    "MetricsConfig", "ModelConfig", "RecipeConfig", "RolloutConfig", "ShapingConfig", "TaskConfig", "TrainConfig",
    "VinePPOConfig", "apply_overrides", "config_from_dict", "load_config", "load_config_json", "parse_overrides",
    "replace_values", "save_config", "schema_help"]
