"""Test-wide setup.

Eight fake CPU devices let sharding tests build a real NamedSharding mesh on
one machine. XLA reads the flag once, before the first jax import, so it is
set here at the top of the session.

A persistent JAX compilation cache lives for one pytest session only: a fresh
temporary folder, removed when the session ends. Tests build new jit objects
(a Learner, a sampler, a decoder wrapper per test) around the same programs;
with the cache, XLA compiles each distinct program once per session and later
jit objects load the executable from disk instead of compiling it again. No
entry outlives the session, so every session (and every `make test` folder,
one process each) starts cold, and tests stay independent of each other's
sessions. Subprocesses the tests start do not inherit it (it is set through
jax.config in this process, not through the environment).
JAXRL_TEST_COMPILATION_CACHE=0 turns it off (to time the suite without it).
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


import gc  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

_SESSION_CACHE_DIR = None


def enable_session_compilation_cache(directory: str) -> None:
    """Every program compiled from now on is written to `directory` and read back from
    it when compiled again, however short its compilation (thresholds at 0)."""
    import jax

    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)  # no size threshold, no override
    jax.config.update("jax_persistent_cache_enable_xla_caches", "none")  # the GPU-only XLA caches: compile options as without it


def pytest_configure(config):
    global _SESSION_CACHE_DIR
    if os.environ.get("JAXRL_TEST_COMPILATION_CACHE", "1") == "0":
        return
    _SESSION_CACHE_DIR = tempfile.mkdtemp(prefix="jaxrl_test_jit_cache_")
    enable_session_compilation_cache(_SESSION_CACHE_DIR)


def pytest_unconfigure(config):
    if _SESSION_CACHE_DIR is not None:
        shutil.rmtree(_SESSION_CACHE_DIR, ignore_errors=True)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop JAX's compiled programs after each test module: a suite that compiles
    hundreds of programs otherwise keeps gigabytes of them alive. (Programs compiled
    again later come from the session's compilation cache on disk.)"""
    yield
    import jax

    jax.clear_caches()
    gc.collect()
