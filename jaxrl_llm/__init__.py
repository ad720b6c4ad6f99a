"""jaxrl_llm: reinforcement-learning post-training of language models in JAX.

Layout (dependencies point one way): core <- models <- bridge <- rollout <- train <- cli;
core <- rewards <- data <- train; reports/ and benchmarks/ sit on train, below cli; utils/
is the lowest layer. tests/structure/test_import_graph.py checks this and that no import
cycle exists.
"""

__version__ = "0.1.0"
