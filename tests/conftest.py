"""Test-wide setup.

Eight fake CPU devices let sharding tests build a real NamedSharding mesh on
one machine. XLA reads the flag once, before the first jax import, so it is
set here at the top of the session.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


import gc  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop JAX's compiled programs after each test module: a suite that compiles
    hundreds of programs otherwise keeps gigabytes of them alive."""
    yield
    import jax

    jax.clear_caches()
    gc.collect()
