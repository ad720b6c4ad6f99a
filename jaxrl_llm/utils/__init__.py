"""jaxrl_llm.utils: generic helpers that import nothing of jaxrl_llm (the lowest layer)."""
