"""Test-wide setup.

Eight fake CPU devices let sharding tests build a real NamedSharding mesh on
one machine. XLA reads the flag once, before the first jax import, so it is
set here at the top of the session.

A persistent JAX compilation cache lives for one pytest session only: a fresh
temporary folder, removed when the session ends. Tests build new jit objects
(a Learner, a sampler, a decoder wrapper per test) around the same programs;
with the cache, XLA compiles each distinct program once per session and later
jit objects load the executable from disk instead of compiling it again. The
processes the tests start (a killed and resumed run, two `jax.distributed`
processes, `jaxrl train`) inherit it through the environment (JAX_* variables)
and share it: a resumed child loads what the killed one compiled. A size limit
turns on JAX's cross-process file lock, so concurrent processes never read a
half-written entry. No entry outlives the session, so every session (and every
`make test` folder, one process each) starts cold.
It is ON unless JAXRL_TEST_COMPILATION_CACHE=0. On 2026-11-25 (jax 0.10.2) 2 of 3 runs of
tests/train with it aborted the process (SIGABRT inside jax.device_get in
test_async_equivalence.py while the async producer thread waited); on 2026-11-28 the same
modules passed 3 of 3 times with it (twice alone, once collected with the whole folder), and a
whole tests/train run passed (docs/benchmarks.md#test-suite-duration). It cuts the CPU time of a
kill-and-resume test by ~40 % (the resumed child loads what the killed one compiled). If the
abort comes back, JAXRL_TEST_COMPILATION_CACHE=0 turns it off.

Time limits (pytest-timeout, default in pyproject.toml): tests marked `vllm` get
VLLM_TIMEOUT_S (the first one to use the shared server pays its startup, up to 900 s),
`slow` ones SLOW_TIMEOUT_S; an explicit @pytest.mark.timeout wins. With JAXRL_TEST_RECORD
set (`make test`), the ids of the tests now running are kept in $JAXRL_TEST_RECORD/current_test,
so a run stopped from outside (.ci/run's overall limit) can say where it was, and each
test's phase durations go to $JAXRL_TEST_RECORD/durations.tsv (`make test` prints the slowest).
Under pytest-xdist (`-n 2`, the folders of XDIST_DIRS in the Makefile) the controller writes
both records from the reports its workers send; the workers write none.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


import gc  # noqa: E402
import importlib.util  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

import pytest  # noqa: E402

_SESSION_CACHE_DIR = None
VLLM_TIMEOUT_S = 1200
SLOW_TIMEOUT_S = 1800


# jax.config name -> value; each is also read from the environment variable of the
# upper-cased name when a child process imports jax.
SESSION_CACHE_SETTINGS = {
    "jax_persistent_cache_min_compile_time_secs": 0.0,  # cache every program, however fast it compiles
    "jax_persistent_cache_min_entry_size_bytes": -1,  # no size threshold, no filesystem override
    "jax_persistent_cache_enable_xla_caches": "none",  # the GPU-only XLA caches: compile options as without it
    "jax_compilation_cache_max_size": 16 << 30,  # never reached; a limit makes JAX lock the folder across processes
}


def enable_session_compilation_cache(directory: str) -> None:
    """Every program compiled from now on, in this process and in the processes it starts,
    is written to `directory` and read back from it when compiled again."""
    import jax

    settings = {"jax_compilation_cache_dir": directory, **SESSION_CACHE_SETTINGS}
    for name, value in settings.items():
        os.environ[name.upper()] = str(value)
        jax.config.update(name, value)
    skip_eviction_scan()


def skip_eviction_scan() -> None:
    """With a size limit, JAX's cache (jax/_src/lru_cache.py, jax 0.10.2) lists and stats every
    entry of the folder under the lock before each write, to evict the least recently used ones:
    quadratic in the entries a session writes. Ours never nears its 16 GB limit, so in the test
    process the scan is skipped; the lock (its reason for the limit) stays. Measured 2026-11-28
    (tests/train test_packing + test_learner + test_router_terms, 574 writes): 8.4 of 127 s in the
    scan, ~14.6 ms a write at ~290 entries; a whole tests/train session writes thousands."""
    from jax._src import lru_cache

    if hasattr(lru_cache.LRUCache, "_evict_if_needed"):
        lru_cache.LRUCache._evict_if_needed = lambda self, *, additional_size=0: None


def pytest_configure(config):
    global _SESSION_CACHE_DIR
    if os.environ.get("JAXRL_TEST_COMPILATION_CACHE", "1") == "0":
        return
    if importlib.util.find_spec("filelock") is None:  # JAX's cross-process lock of the cache folder
        return
    _SESSION_CACHE_DIR = tempfile.mkdtemp(prefix="jaxrl_test_jit_cache_")
    enable_session_compilation_cache(_SESSION_CACHE_DIR)


def pytest_unconfigure(config):
    if _SESSION_CACHE_DIR is not None:
        shutil.rmtree(_SESSION_CACHE_DIR, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("timeout") is None:
            limit = max([VLLM_TIMEOUT_S] * bool(item.get_closest_marker("vllm"))
                        + [SLOW_TIMEOUT_S] * bool(item.get_closest_marker("slow")), default=None)
            if limit:
                item.add_marker(pytest.mark.timeout(limit))


def _record_dir() -> str | None:
    """$JAXRL_TEST_RECORD when set and present, in the process that reports (under pytest-xdist
    the controller, which receives every worker's reports; a worker records nothing itself, so
    one process writes each record)."""
    record = os.environ.get("JAXRL_TEST_RECORD")
    if record and os.path.isdir(record) and not os.environ.get("PYTEST_XDIST_WORKER"):
        return record
    return None


_RUNNING: dict[str, None] = {}  # the tests started and not yet finished, in start order


def _write_current_tests(record: str) -> None:
    with open(os.path.join(record, "current_test"), "w") as f:
        f.write("".join(f"{nodeid}\n" for nodeid in _RUNNING))


def pytest_runtest_logreport(report):
    """With JAXRL_TEST_RECORD set, each phase's duration (setup, call, teardown) is appended to
    $JAXRL_TEST_RECORD/durations.tsv, so `make test` can name its slowest tests at the end. One
    line per write, in append mode: lines from the pytest processes of several folders never mix."""
    record = _record_dir()
    if record:
        with open(os.path.join(record, "durations.tsv"), "a") as f:
            f.write(f"{report.duration:.2f}\t{report.nodeid}\n")


def pytest_runtest_logstart(nodeid, location):
    """$JAXRL_TEST_RECORD/current_test holds the tests now running, one a line (one without
    pytest-xdist, up to one per worker with it)."""
    record = _record_dir()
    if record:
        _RUNNING[nodeid] = None
        _write_current_tests(record)


def pytest_runtest_logfinish(nodeid, location):
    record = _record_dir()
    if record:
        _RUNNING.pop(nodeid, None)
        if _RUNNING:  # when none runs, the last one started stays named (a stop in teardown)
            _write_current_tests(record)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop JAX's compiled programs after each test module: a suite that compiles
    hundreds of programs otherwise keeps gigabytes of them alive. (Programs compiled
    again later come from the session's compilation cache on disk.)"""
    yield
    import jax

    jax.clear_caches()
    gc.collect()
