"""jaxrl_llm.rollout."""
