"""jaxrl_llm.rewards."""
