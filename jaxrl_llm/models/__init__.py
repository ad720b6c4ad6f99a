"""jaxrl_llm.models."""
