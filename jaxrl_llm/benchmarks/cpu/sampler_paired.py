"""The JAX sampler of another commit against this one, called in turns in one process.

    git show COMMIT:jaxrl_llm/rollout/jax_sampler.py > /tmp/jax_sampler_before.py
    python -m jaxrl_llm.benchmarks.cpu.sampler_paired --before /tmp/jax_sampler_before.py \
        [--cells 64x32,64x256] [--rounds 2] [--tiny]

or ``make bench-sampler-paired SAMPLER_BEFORE=COMMIT`` (default HEAD: the working tree's sampler
against the last commit's).

SmolLM2-135M float32, the ratio table's 8 chat prompts x batch/8 samples, temperature 1,
seed 0, EOS stop. Each cell compiles both programs (untimed first call), then times the two
samplers alternately ``--rounds`` times and prints the medians, their ratio, the completion
tokens each drew (seeded draws of two programs can differ by float32 rounding, and then so
do the lengths) and the load average. A paired ratio survives a drifting load that two
separate runs do not. ``--tiny`` (the tests): a random 2-layer decoder over SmolLM2's tokenizer
(``addition_start.policy_from_scratch``), one 8x4 cell, one round.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
from pathlib import Path


def load_sampler_module(path: str):
    """The module in file ``path`` (an older jax_sampler.py), imported under its own name."""
    if not Path(path).is_file():
        raise SystemExit(f"--before {path!r} is not a file; write one with "
                         "`git show COMMIT:jaxrl_llm/rollout/jax_sampler.py > FILE`")
    spec = importlib.util.spec_from_file_location("jax_sampler_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_cells(text: str) -> list[tuple[int, int]]:
    """"64x32,256x256" -> [(64, 32), (256, 256)]; batches must be multiples of 8 (8 prompts)."""
    cells = []
    for item in text.split(","):
        batch, _, tokens = item.partition("x")
        if not (batch.isdigit() and tokens.isdigit()) or int(batch) % 8 or int(batch) == 0 or int(tokens) == 0:
            raise SystemExit(f"--cells entry {item!r} is not BATCHxTOKENS with BATCH a positive multiple of 8")
        cells.append((int(batch), int(tokens)))
    return cells


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, help="path of the older jax_sampler.py")
    parser.add_argument("--cells", default="8x32,64x32,256x32,8x256,64x256,256x256")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="a random 2-layer model, one 8x4 cell, one round")
    args = parser.parse_args(argv)
    if args.tiny:
        args.cells, args.rounds = "8x4", 1
    cells = parse_cells(args.cells)
    before = load_sampler_module(args.before)
    from jaxrl_llm.benchmarks.cpu.rollout import EOS, chat_prompts, timed_generate
    from jaxrl_llm.bridge import load_hf_dir, smollm2_hf_dir
    from jaxrl_llm.rollout import SamplingParams
    from jaxrl_llm.rollout.jax_sampler import JaxSampler

    hf_dir = smollm2_hf_dir()
    if args.tiny:
        import tempfile

        from jaxrl_llm.benchmarks.common.addition_start import policy_from_scratch

        with tempfile.TemporaryDirectory() as folder:
            policy = policy_from_scratch(hf_dir, folder, 64, 2, 0)
        cfg, params = policy.cfg, policy.params
    else:
        cfg, params = load_hf_dir(hf_dir)
    prompts = chat_prompts(hf_dir, 8)
    engines = {"before": before.JaxSampler(cfg, params, eos_token_ids=[EOS]),
               "after": JaxSampler(cfg, params, eos_token_ids=[EOS])}
    results = []
    for batch, max_tokens in cells:
        sampling = SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=0)
        for engine in engines.values():
            engine.generate(prompts, batch // 8, sampling)  # compiles
        load = os.getloadavg()[0]
        times, tokens = {name: [] for name in engines}, {}
        for _ in range(args.rounds):
            for name, engine in engines.items():
                _, seconds, tokens[name] = timed_generate(engine, prompts, batch // 8, sampling)
                times[name].append(seconds)
        row = {"batch": batch, "max_tokens": max_tokens, "load_start": load, "load_end": os.getloadavg()[0],
               **{f"{name}_s": statistics.median(t) for name, t in times.items()},
               **{f"{name}_tokens": n for name, n in tokens.items()}}
        row["speedup"] = row["before_s"] / row["after_s"]
        results.append(row)
        print(f"{batch} x {max_tokens}: before {row['before_s']:.2f} s ({tokens['before']} tokens), after "
              f"{row['after_s']:.2f} s ({tokens['after']} tokens), before / after {row['speedup']:.2f}x, "
              f"load {load:.1f} -> {row['load_end']:.1f}", flush=True)
    return results


if __name__ == "__main__":
    main()
