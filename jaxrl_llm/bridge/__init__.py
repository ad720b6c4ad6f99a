"""jaxrl_llm.bridge."""
