"""jaxrl_llm.train."""
