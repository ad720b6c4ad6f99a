"""jaxrl_llm.data."""
