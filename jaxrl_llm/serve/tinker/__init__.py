"""The Tinker API served by jaxrl_llm (`jaxrl serve-tinker`, docs/tinker.md).

wire.py (protobuf / JSON formats), losses.py (Tinker losses -> core.losses), adapters.py (LoraConfig
-> LoRA adapters), learner.py (forward / forward_backward / optim_step), sampling.py (sample on
the JAX sampler), jobs.py (futures, retries), service.py (models, sessions, checkpoints),
app.py (HTTP routes), server.py (start and stop).
"""
