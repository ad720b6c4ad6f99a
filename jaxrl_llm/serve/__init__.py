"""Servers that expose the project's learner and sampler to other clients' APIs (`jaxrl serve-*`).

`tinker/`: the Tinker API (tinker SDK 0.38, tinker-cookbook 0.6), docs/tinker.md.
"""
