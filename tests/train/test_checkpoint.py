"""Orbax checkpoints: exact restore, retention, crash safety, SIGTERM stop flag."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxrl_llm.train.run.checkpoint import Checkpointer, install_stop_handler

WORKER = Path(__file__).with_name("ckpt_worker.py")
REPO = Path(__file__).resolve().parents[2]


def _loss(params, x):
    return jnp.sum((x @ params["w"] + params["b"].astype(jnp.float32)) ** 2)


_OPT = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-2, weight_decay=0.1))


@jax.jit
def _train_step(params, opt_state, key, x):
    grads = jax.grad(_loss)(params, x)
    updates, opt_state = _OPT.update(grads, opt_state, params)
    key, sub = jax.random.split(key)
    return optax.apply_updates(params, updates), opt_state, key, jax.random.normal(sub, (3,))


def _make_state(num_steps: int):
    """A real training state after `num_steps` adamw steps (mu, nu, count all non-trivial)."""
    key, k1, k2 = jax.random.split(jax.random.key(42), 3)
    params = {"w": jax.random.normal(k1, (8, 4)), "b": jnp.ones(4, jnp.bfloat16)}
    opt_state = _OPT.init(params)
    x = jax.random.normal(k2, (16, 8))
    for _ in range(num_steps):
        params, opt_state, key, _ = _train_step(params, opt_state, key, x)
    state = {
        "params": params,
        "opt_state": opt_state,
        "rng": key,  # typed key
        "legacy_rng": jax.random.PRNGKey(7),  # raw uint32[2] key
        "step": jnp.int32(num_steps),
        "loss_scale": jnp.float32(2.0**15),
        "data_position": np.int64(1234567890123),
        "lr_seen": 0.1,  # a Python float
    }
    return state, x


def _zeros_like(leaf):
    if isinstance(leaf, jax.Array):
        return jax.random.key(0) if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key) else jnp.zeros_like(leaf)
    return type(leaf)(0)  # np.int64, float


def _bits(leaf):
    if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
    arr = np.asarray(leaf)
    return arr.dtype, arr.shape, arr.tobytes()


def _assert_bitwise_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert type(x) is type(y)
        if isinstance(x, jax.Array):
            assert x.dtype == y.dtype  # key<fry> stays a typed key
        assert _bits(x) == _bits(y)


def test_restore_is_bitwise_exact_and_training_continues_identically(tmp_path):
    state, x = _make_state(num_steps=3)
    assert int(state["opt_state"][1][0].count) == 3 and float(jnp.abs(state["opt_state"][1][0].nu["w"]).sum()) > 0
    with Checkpointer(tmp_path / "ckpt", every_steps=3, keep=2) as ckpt:
        assert ckpt.save(3, state, metadata={"data": {"epoch": 1}, "note": "adam"})
    # A fresh manager (as after a restart) restores into a target of zeros:
    # every value must come from disk.
    target = jax.tree.map(_zeros_like, state)
    with Checkpointer(tmp_path / "ckpt", every_steps=3, keep=2) as ckpt:
        restored = ckpt.restore(target)
    assert restored.step == 3
    assert restored.metadata == {"data": {"epoch": 1}, "note": "adam"}
    _assert_bitwise_equal(restored.state, state)
    assert isinstance(restored.state["opt_state"][1][0], optax.ScaleByAdamState)
    assert restored.state["data_position"] == 1234567890123 and type(restored.state["data_position"]) is np.int64
    assert restored.state["lr_seen"] == 0.1

    # One more step from the original and from the restored state must agree bit for bit.
    def step(s):
        return _train_step(s["params"], s["opt_state"], s["rng"], x)

    _assert_bitwise_equal(step(restored.state), step(state))


def test_restore_into_a_different_sharding(tmp_path):
    assert jax.device_count() == 8
    mesh = jax.make_mesh((4, 2), ("data", "fsdp"))
    w = np.arange(64, dtype=np.float32).reshape(16, 4)
    saved = {"w": jax.device_put(w, NamedSharding(mesh, P("data", "fsdp")))}
    with Checkpointer(tmp_path, every_steps=1, keep=1) as ckpt:
        ckpt.save(1, saved)
        want = NamedSharding(mesh, P(("data", "fsdp"), None))
        target = {"w": jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=want)}
        restored = ckpt.restore(target).state["w"]
    assert restored.sharding == want
    np.testing.assert_array_equal(np.asarray(restored), w)


def test_periodic_saving_retention_and_forced_saves(tmp_path):
    state = {"x": jnp.arange(3)}
    with Checkpointer(tmp_path, every_steps=2, keep=2) as ckpt:
        assert ckpt.restore_latest(state) is None
        saved = [step for step in range(1, 7) if ckpt.save(step, {"x": state["x"] + step})]
        assert saved == [2, 4, 6]
        assert ckpt.save(7, {"x": state["x"] + 7}, force=True)
        assert not ckpt.save(7, state, force=True)  # already on disk
        ckpt.wait()
        assert ckpt.all_steps() == [6, 7]
        np.testing.assert_array_equal(ckpt.restore_latest(state).state["x"], [7, 8, 9])
        np.testing.assert_array_equal(ckpt.restore(state, step=6).state["x"], [6, 7, 8])
        with pytest.raises(FileNotFoundError, match=r"no checkpoint for step 4 .*available: \[6, 7\]"):
            ckpt.restore(state, step=4)


def test_invalid_arguments():
    with pytest.raises(ValueError, match=r"keep = 0 is invalid; valid: >= 1"):
        Checkpointer("/tmp/unused-ckpt", every_steps=1, keep=0)
    with pytest.raises(ValueError, match=r"every_steps = -1 is invalid"):
        Checkpointer("/tmp/unused-ckpt", every_steps=-1, keep=1)


def _start_worker(mode: str, directory: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    env.pop("XLA_FLAGS", None)  # one CPU device per process
    return subprocess.Popen(
        [sys.executable, str(WORKER), mode, str(directory), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )


def _wait_for_line(proc: subprocess.Popen, prefix: str, timeout: float = 60.0) -> list[str]:
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"worker exited before {prefix!r}: {seen} {proc.stderr.read()[-2000:]}")
        seen.append(line.strip())
        if line.startswith(prefix):
            return seen
    raise AssertionError(f"no {prefix!r} within {timeout}s: {seen}")


def _dir_bytes(path: Path) -> int:
    """Bytes of the files under path while a writer is still changing it: orbax creates and deletes
    lock files as it goes, so a file (or folder) seen by the walk may be gone when asked."""
    total = 0
    for folder, _, files in os.walk(path):  # os.walk skips folders that vanish
        for name in files:
            try:
                total += os.stat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                pass
    return total


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_crash_mid_save_leaves_previous_checkpoint_restorable(signum, tmp_path):
    """Killed (SIGKILL) or terminated (SIGTERM, no handler installed) while step 2 is being
    written: step 1 stays valid and bitwise restorable."""
    directory = tmp_path / "ckpt"
    proc = _start_worker("crash", directory)
    try:
        _wait_for_line(proc, "saving 2")
        # Kill once the step-2 write is visibly under way (part of the 256 MiB on disk).
        tmp_dir = directory / "2.orbax-checkpoint-tmp"
        deadline = time.monotonic() + 30
        while not (tmp_dir.exists() and _dir_bytes(tmp_dir) > 4 * 2**20):
            assert time.monotonic() < deadline and proc.poll() is None, "step-2 save never started"
            time.sleep(0.002)
        proc.send_signal(signum)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signum
    assert "saved 2" not in proc.stdout.read()
    assert not (directory / "2").exists()
    assert 4 * 2**20 < _dir_bytes(tmp_dir) < 256 * 2**20  # really half-written

    from tests.train.ckpt_worker import small_state

    expected = small_state(1)
    with Checkpointer(directory, every_steps=1, keep=5) as ckpt:
        assert ckpt.all_steps() == [1]
        restored = ckpt.restore(expected)
        assert restored.metadata == {"note": "complete"}
        _assert_bitwise_equal(restored.state, expected)
        # The interrupted step can be written again.
        assert ckpt.save(2, small_state(2))
        ckpt.wait()
        assert ckpt.all_steps() == [1, 2]
        assert not tmp_dir.exists()  # the partial directory was cleaned up


def test_sigterm_sets_flag_and_loop_saves_and_exits_cleanly(tmp_path):
    proc = _start_worker("sigterm", tmp_path)
    try:
        _wait_for_line(proc, "step 3")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-2000:]
    saved_line = [line for line in out.splitlines() if line.startswith("saved ")]
    assert len(saved_line) == 1 and saved_line[0].endswith("after SIGTERM")
    stopped_at = int(saved_line[0].split()[1])
    assert stopped_at >= 3
    with Checkpointer(tmp_path, every_steps=1000, keep=2) as ckpt:
        restored = ckpt.restore({"w": jnp.zeros(4), "step": np.int64(0)})
    assert restored.step == stopped_at
    assert restored.metadata == {"stopped_by": "SIGTERM"}
    np.testing.assert_array_equal(restored.state["w"], np.full(4, float(stopped_at)))  # w = step * 1.0


def test_second_sigterm_falls_back_to_default_termination(tmp_path):
    proc = _start_worker("stubborn", tmp_path)
    try:
        _wait_for_line(proc, "ready")
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert proc.poll() is None  # first signal only sets the flag
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGTERM


def test_stop_flag_in_process_and_uninstall():
    before = signal.getsignal(signal.SIGUSR1)
    with install_stop_handler((signal.SIGUSR1,)) as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGUSR1)
        deadline = time.monotonic() + 5
        while not stop.requested and time.monotonic() < deadline:
            time.sleep(0.001)  # the handler runs between bytecodes of the main thread
        assert stop.requested and stop.signal_name == "SIGUSR1"
        assert stop.requested_on_any_process()  # single process: the local flag
    assert signal.getsignal(signal.SIGUSR1) is before


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_on_one_process_stops_every_process_at_the_same_step(tmp_path):
    """Two jax.distributed processes; only process 1 gets SIGTERM, both must save and stop together."""
    port = str(_free_port())
    procs = [_start_worker("multihost", tmp_path, str(i), port) for i in range(2)]
    try:
        _wait_for_line(procs[1], "step 3")
        procs[1].send_signal(signal.SIGTERM)
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outputs]
    stops = [[line for line in out.splitlines() if line.startswith("stopped")] for out, _ in outputs]
    step = int(stops[1][0].split()[1])
    assert stops == [[f"stopped {step} local=False"], [f"stopped {step} local=True"]]
    # The checkpoint both processes wrote together restores in this single process.
    with Checkpointer(tmp_path, every_steps=1000, keep=2) as ckpt:
        restored = ckpt.restore({"w": jnp.zeros(8)})
    assert restored.step == step and restored.metadata == {"stopped_at": step}
    np.testing.assert_array_equal(restored.state["w"], np.arange(8, dtype=np.float32) * step)
