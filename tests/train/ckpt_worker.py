"""Child process for the checkpoint tests (crash mid-save, SIGTERM).

    python ckpt_worker.py crash DIR      save step 1 (small), then a big step 2; killed by the test
    python ckpt_worker.py sigterm DIR    train-like loop that saves and exits on SIGTERM
    python ckpt_worker.py stubborn DIR   installs the handler but never checks it
    python ckpt_worker.py multihost DIR PROCESS_ID PORT
                                         one of two jax.distributed processes; all stop
                                         and save together when any one gets SIGTERM

Prints one marker line per event so the parent can synchronise on them.
"""

import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jaxrl_llm.train.run.checkpoint import Checkpointer, install_stop_handler  # noqa: E402


def small_state(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((64, 32)).astype(np.float32), "step": np.int64(seed)}


def big_state() -> dict:
    # Random bits do not compress, so writing 256 MiB takes long enough to be killed mid-way.
    rng = np.random.default_rng(123)
    return {f"w{i}": rng.integers(0, 2**32, size=(16 * 1024 * 1024,), dtype=np.uint32) for i in range(4)}


def crash(directory: str) -> None:
    ckpt = Checkpointer(directory, every_steps=1, keep=5)
    ckpt.save(1, small_state(1), metadata={"note": "complete"})
    ckpt.wait()
    print("saved 1", flush=True)
    state = big_state()
    print("saving 2", flush=True)
    ckpt.save(2, state)
    ckpt.wait()
    print("saved 2", flush=True)


def sigterm(directory: str) -> None:
    stop = install_stop_handler()
    ckpt = Checkpointer(directory, every_steps=1000, keep=2)
    w = jnp.zeros(4)
    for step in range(1, 10_000):
        w = w + 1.0  # stands in for a learner step
        print(f"step {step}", flush=True)
        if stop.requested:
            ckpt.save(step, {"w": w, "step": np.int64(step)}, metadata={"stopped_by": stop.signal_name}, force=True)
            ckpt.close()
            print(f"saved {step} after {stop.signal_name}", flush=True)
            sys.exit(0)
        time.sleep(0.02)


def stubborn(directory: str) -> None:
    install_stop_handler()
    print("ready", flush=True)
    while True:
        time.sleep(0.01)


def multihost(directory: str, process_id: str, port: str) -> None:
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=int(process_id))
    stop = install_stop_handler()
    ckpt = Checkpointer(directory, every_steps=1000, keep=2)
    # One global array, half on each process.
    sharding = NamedSharding(jax.make_mesh((2,), ("data",)), P("data"))
    base = np.arange(8, dtype=np.float32)
    for step in range(1, 10_000):
        w = jax.make_array_from_callback((8,), sharding, lambda index: base[index] * step)
        print(f"step {step}", flush=True)
        time.sleep(0.02)
        if stop.requested_on_any_process():
            ckpt.save(step, {"w": w}, metadata={"stopped_at": step}, force=True)
            ckpt.close()
            print(f"stopped {step} local={stop.requested}", flush=True)
            return


if __name__ == "__main__":
    modes = {"crash": crash, "sigterm": sigterm, "stubborn": stubborn, "multihost": multihost}
    modes[sys.argv[1]](*sys.argv[2:])
