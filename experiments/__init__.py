"""Experiment configs: one file per experiment, each with get_config() (see jaxrl_llm.train.config)."""
