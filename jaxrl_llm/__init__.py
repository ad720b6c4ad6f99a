"""jaxrl_llm: reinforcement-learning post-training of language models in JAX.

Layout (dependencies point one way): core <- models <- bridge <- rollout <- train <- cli.
rewards/ and data/ depend on nothing of ours.
"""

__version__ = "0.1.0"
