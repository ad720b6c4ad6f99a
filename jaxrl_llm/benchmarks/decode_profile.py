"""Where one decode step of the JAX sampler spends its time, by phase.

    python -m jaxrl_llm.benchmarks.decode_profile [--batches 8,64] [--prompt-len 32] [--max-tokens 32]
                                                  [--fills 0.5] [--variants full,windowed]

Each phase of a decode step is jitted on its own and timed on SmolLM2-135M
(float32) with the KV cache of a `--prompt-len` prompt + `--max-tokens`
generation, filled to each of `--fills` (fractions; default half); the phases
run interleaved (one call each per round, median over rounds) so all see the
same load. `--variants` names the cache reads whose ``layers`` / ``attention``
phases are timed: ``full`` reads all max_len slots each step (before),
``windowed`` only the filled 32-slot windows (``cache_window=32``, after):

* ``layers``: the 30 decoder layers for one token (matmuls + attention + cache write),
* ``matmuls``: the layers' projections alone (q/k/v/o, gate/up/down),
* ``attention``: attention of one query per row over the cache, 30 layers,
* ``lm_head``: final hidden -> float32 logits [B, V],
* ``log_softmax``: the float32 log-softmax of the logits,
* ``rng``: the sampler's per-step random draw,
* ``sampling``: log-softmax + draw + choice (what the sampler runs per step),
* ``step (in loop)``: measured in the real sampler: (time of `max_tokens` tokens - time of
  1 token) / (max_tokens - 1), no stop token, so it includes loop and cache-update costs
  (an average over fills; with ``--variants``, per variant).

The sum of the separate phases next to the in-loop step shows what the loop adds.

``--lever window|one-row|compactions|all`` instead times the whole decode program (real
prompts, EOS stop) with and without one change, interleaved (`LEVERS`).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np


CACHE_WINDOWS = {"full": None, "windowed": 32}


def phase_fns(cfg, batch: int, cache_len: int, sampler_fn, fill: float = 0.5, cache_window: int | None = None):
    """name -> (jitted fn, args): the phases of a decode step at ``batch`` rows, the cache
    filled to ``fill`` of its ``cache_len`` slots, attention reading it per ``cache_window``."""
    from jaxrl_llm.models import forward, init_cache, lm_head_logits
    from jaxrl_llm.models.decoder import grouped_attention, windowed_cache_attention

    rng = np.random.default_rng(0)
    filled = min(cache_len - 1, max(1, int(round(cache_len * fill))))
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, 1)), jnp.int32)
    cache = init_cache(cfg, batch, cache_len)
    cache = dict(cache, end=jnp.int32(filled), mask=cache["mask"].at[:, :filled].set(True),
                 next_pos=jnp.full((batch,), filled, jnp.int32))
    hidden = jnp.asarray(rng.normal(size=(batch, cfg.hidden_size)), jnp.float32)
    logits = jnp.asarray(rng.normal(size=(batch, cfg.vocab_size)) * 3, jnp.float32)
    q = jnp.asarray(rng.normal(size=(batch, 1, cfg.num_heads, cfg.head_dim)), jnp.float32)
    kv = jnp.asarray(rng.normal(size=(2, 1, batch, cache_len, cfg.num_kv_heads, cfg.head_dim)), jnp.float32)
    visible = jnp.asarray(np.arange(cache_len)[None, None, :] < filled + 1).repeat(batch, 0)

    def layers(params, tokens, cache):
        out, new_cache = forward(params, cfg, tokens, cache=cache, return_hidden=True, cache_window=cache_window)
        return out, new_cache["k"][0, 0, 0, 0, 0]

    def matmuls(params, hidden):
        layer = params["layers"]

        def one(h, w):
            q = h @ w["q_proj"]
            k = h @ w["k_proj"]
            v = h @ w["v_proj"]
            a = (q + jnp.tile(k + v, 3)) @ w["o_proj"]
            h = h + a
            return h + (jax.nn.silu(h @ w["gate_proj"]) * (h @ w["up_proj"])) @ w["down_proj"], None

        return jax.lax.scan(one, hidden, layer)[0]

    def attention(q, kv, visible):
        def one(acc, _):
            if cache_window is None:
                return acc + grouped_attention(q, kv[0, 0], kv[1, 0], visible), None
            layer_kv = {"k": kv[0], "v": kv[1]}
            return acc + windowed_cache_attention(q, layer_kv, jnp.int32(0), visible, filled + 1, cache_window), None

        return jax.lax.scan(one, jnp.zeros_like(q), None, length=cfg.num_layers)[0]

    def head(params, hidden):
        return lm_head_logits(hidden, params, cfg)

    def log_softmax(logits):
        return jax.nn.log_softmax(logits / 1.0, axis=-1)

    key = jax.random.key(0)
    return {
        "layers": (jax.jit(layers), ("params", tokens, cache)),
        "matmuls": (jax.jit(matmuls), ("params", hidden)),
        "attention": (jax.jit(attention), (q, kv, visible)),
        "lm_head": (jax.jit(head), ("params", hidden)),
        "log_softmax": (jax.jit(log_softmax), (logits,)),
        "rng": (jax.jit(sampler_fn("rng")), (logits, key)),
        "sampling": (jax.jit(sampler_fn("all")), (logits, key)),
    }


def gumbel_sampler(part: str):
    """The sampler's original per-step draw: Gumbel noise over the whole [B, V]."""
    from jaxrl_llm.rollout.jax_sampler import filtered_logprobs

    def fn(logits, key):
        if part == "rng":
            return jax.random.gumbel(key, logits.shape, jnp.float32)
        logp = filtered_logprobs(logits, jnp.float32(1.0), None, jnp.float32(1.0), False)
        token = jnp.argmax(logp + jax.random.gumbel(key, logits.shape, jnp.float32), axis=-1)
        return token, jnp.take_along_axis(logp, token[:, None], axis=-1)

    return fn


def inverse_cdf_sampler(part: str):
    """The sampler's current per-step draw: one uniform per row, inverse CDF."""
    from jaxrl_llm.rollout.jax_sampler import filtered_logprobs, inverse_cdf_choice

    def fn(logits, key):
        uniform = jax.random.uniform(key, logits.shape[:1])
        if part == "rng":
            return uniform
        logp = filtered_logprobs(logits, jnp.float32(1.0), None, jnp.float32(1.0), False)
        token = inverse_cdf_choice(logp, uniform)
        return token, jnp.take_along_axis(logp, token[:, None], axis=-1)

    return fn


SAMPLERS = {"baseline": gumbel_sampler, "current": inverse_cdf_sampler}


def paired_compaction(cfg, params, prompts, batch: int, max_tokens: int, rounds: int) -> dict[str, float]:
    """Median seconds of the current decode program with and without dropping finished rows,
    interleaved, with the chat EOS (id 2) as stop token so rows finish at their own lengths."""
    from jaxrl_llm.benchmarks.model import interleaved_times
    from jaxrl_llm.rollout.jax_sampler import _generate

    args = _decode_args(cfg, params, prompts, batch)[:-1] + (jnp.asarray([2], jnp.int32),)
    kwargs = dict(max_tokens=max_tokens, top_k=None, use_top_p=False)
    outs = {c: _generate(*args, **kwargs, compact=c) for c in (False, True)}
    lengths = [np.asarray(o[2]) for o in outs.values()]
    print(f"  completion lengths: mean {lengths[0].mean():.1f}, max {lengths[0].max()}; "
          f"rows with equal tokens: {np.mean(np.all(np.asarray(outs[False][0]) == np.asarray(outs[True][0]), 1)):.2f}",
          flush=True)
    steps = {"all rows": lambda: jax.block_until_ready(_generate(*args, **kwargs, compact=False)),
             "compacted": lambda: jax.block_until_ready(_generate(*args, **kwargs, compact=True))}
    times = interleaved_times(steps, 0, rounds)
    return {name: statistics.median(t) for name, t in times.items()}


def paired_generate(cfg, params, prompts, batch: int, max_tokens: int, rounds: int) -> dict[str, float]:
    """Median seconds of the whole decode program, before (`sampler_baseline`) and now
    (`jax_sampler._generate`), called alternately on the same inputs (no stop token, so
    both generate batch x max_tokens tokens)."""
    from jaxrl_llm.benchmarks.model import interleaved_times
    from jaxrl_llm.benchmarks.sampler_baseline import generate_baseline
    from jaxrl_llm.rollout.jax_sampler import _generate

    args = _decode_args(cfg, params, prompts, batch)
    kwargs = dict(max_tokens=max_tokens, top_k=None, use_top_p=False)
    steps = {"before": lambda: jax.block_until_ready(generate_baseline(*args, **kwargs)),
             "after": lambda: jax.block_until_ready(_generate(*args, **kwargs))}
    times = interleaved_times(steps, 1, rounds)
    return {name: statistics.median(t) for name, t in times.items()}


XLA_VARIANTS: dict[str, dict] = {
    "default": {},
    "onednn": {"xla_cpu_use_onednn": True},
    "xnn-dot": {"xla_cpu_experimental_xnn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "onednn-dot": {"xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "eigen-1-thread": {"xla_cpu_multi_thread_eigen": False},
}


def xla_variants(cfg, params, prompts, batch: int, max_tokens: int, rounds: int, names) -> dict[str, float]:
    """Median seconds of the current decode program compiled with each XLA:CPU option set
    (``compile(compiler_options=...)``), interleaved; tokens must equal the default build's."""
    from jaxrl_llm.benchmarks.model import interleaved_times
    from jaxrl_llm.rollout.jax_sampler import _generate

    args = _decode_args(cfg, params, prompts, batch)
    lowered = _generate.lower(*args, max_tokens=max_tokens, top_k=None, use_top_p=False)
    dynamic = (args[0],) + args[2:]  # cfg is static
    compiled, steps = {}, {}
    for name in names:
        try:
            compiled[name] = lowered.compile(compiler_options=XLA_VARIANTS[name])
        except Exception as error:  # an option this jaxlib does not take: say so, go on
            print(f"  {name}: not compiled: {str(error).splitlines()[0][:160]}", flush=True)
            continue
        steps[name] = lambda c=compiled[name]: jax.block_until_ready(c(*dynamic))
    reference = np.asarray(compiled["default"](*dynamic)[0])
    for name, c in compiled.items():
        same = np.array_equal(np.asarray(c(*dynamic)[0]), reference)
        print(f"  {name}: tokens equal to default: {same}", flush=True)
    times = interleaved_times(steps, 1, rounds)
    return {name: statistics.median(t) for name, t in times.items()}


def _decode_args(cfg, params, prompts, batch: int):
    width = -(-max(len(p) for p in prompts) // 16) * 16
    tokens = np.zeros((batch, width), np.int32)
    mask = np.zeros((batch, width), bool)
    for i in range(batch):
        p = prompts[i % len(prompts)]
        tokens[i, width - len(p):], mask[i, width - len(p):] = p, True
    return (params, cfg, jnp.asarray(tokens), jnp.asarray(mask), jax.random.key(0), jnp.float32(1.0),
            jnp.float32(1.0), jnp.asarray([-1], jnp.int32))


# lever -> (kwargs of _generate before, after): one change each, the rest as the sampler runs it
LEVERS: dict[str, tuple[dict, dict]] = {
    "window": (dict(cache_window=None, min_rows=1), dict(cache_window=32, min_rows=1)),
    "one-row": (dict(cache_window=32, min_rows=8), dict(cache_window=32, min_rows=1)),
    "compactions": (dict(cache_window=32, min_rows=1, compactions=3), dict(cache_window=32, min_rows=1)),
    # the three together: main before this change (whole cache, 3 halvings down to 8 rows) vs now
    "all": (dict(cache_window=None, min_rows=8, compactions=3), dict(cache_window=32, min_rows=1, compactions=6)),
}


def paired_lever(cfg, params, prompts, batch: int, max_tokens: int, rounds: int, lever: str) -> dict[str, float]:
    """Median seconds of the decode program before / after one lever (`LEVERS`), interleaved, on
    the real prompts with the chat EOS (id 2) as stop token; also the compile+first-call seconds."""
    from jaxrl_llm.benchmarks.model import interleaved_times
    from jaxrl_llm.rollout.jax_sampler import _generate

    args = _decode_args(cfg, params, prompts, batch)[:-1] + (jnp.asarray([2], jnp.int32),)
    common = dict(max_tokens=max_tokens, top_k=None, use_top_p=False)
    result, outs = {}, {}
    for name, kwargs in zip(("before", "after"), LEVERS[lever]):
        start = time.perf_counter()
        outs[name] = jax.device_get(_generate(*args, **common, **kwargs))
        result[f"{name} compile+first"] = time.perf_counter() - start
    same = np.mean(np.all(outs["before"][0] == outs["after"][0], axis=1))
    print(f"  {lever}: completion tokens {outs['before'][2].sum()} / {outs['after'][2].sum()}, "
          f"rows with equal tokens {same:.2f}, max |dlogp| "
          f"{np.max(np.abs(outs['before'][1] - outs['after'][1])):.1e}", flush=True)
    steps = {name: (lambda kw=kwargs: jax.block_until_ready(_generate(*args, **common, **kw)))
             for name, kwargs in zip(("before", "after"), LEVERS[lever])}
    times = interleaved_times(steps, 0, rounds)
    result.update({name: statistics.median(t) for name, t in times.items()})
    return result


def in_loop_step_seconds(cfg, params, prompts, batch: int, max_tokens: int, rounds: int,
                         cache_window: int | None = 32) -> float:
    """Per-token seconds of the real sampler's decode loop (no stop token)."""
    from jaxrl_llm.rollout.jax_sampler import JaxSampler
    from jaxrl_llm.rollout.types import SamplingParams

    sampler = JaxSampler(cfg, params, eos_token_ids=[-1], cache_window=cache_window)
    rows = [prompts[i % len(prompts)] for i in range(batch)]
    short, long = (SamplingParams(temperature=1.0, max_tokens=m, seed=0) for m in (1, max_tokens))
    for sp in (short, long):
        sampler.generate(rows, 1, sp)
    diffs = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        sampler.generate(rows, 1, short)
        t1 = time.perf_counter()
        sampler.generate(rows, 1, long)
        t2 = time.perf_counter()
        diffs.append(((t2 - t1) - (t1 - t0)) / (max_tokens - 1))
    return statistics.median(diffs)


def profile(cfg, params, prompts, batch: int, cache_len: int, max_tokens: int, rounds: int,
            sampler_fn=inverse_cdf_sampler, fills=(0.5,), variants=("windowed",), loop: bool = True
            ) -> dict[str, float]:
    """Median seconds per phase; with several fills / variants the cache-dependent phases
    (``layers``, ``attention``) are named ``layers [variant, fill]``, the others timed once."""
    from jaxrl_llm.benchmarks.model import interleaved_times

    calls = {}
    several = len(fills) > 1 or len(variants) > 1
    for variant in variants:
        for fill in fills:
            fns = phase_fns(cfg, batch, cache_len, sampler_fn, fill, CACHE_WINDOWS[variant])
            for name, (f, a) in fns.items():
                if several and name in ("layers", "attention"):
                    name = f"{name} [{variant}, {fill:g}]"
                elif name in calls:
                    continue
                calls[name] = lambda f=f, a=a: jax.block_until_ready(f(*[params if x == "params" else x for x in a]))
    times = interleaved_times(calls, 1, rounds)
    result = {name: statistics.median(t) for name, t in times.items()}
    for variant in variants if loop else ():
        name = f"step (in loop) [{variant}]" if len(variants) > 1 else "step (in loop)"
        result[name] = in_loop_step_seconds(cfg, params, prompts, batch, max_tokens, max(2, rounds // 2),
                                            CACHE_WINDOWS[variant])
    return result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", default="8,64")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sampler", choices=sorted(SAMPLERS), default="current",
                        help="which per-step draw the sampling phases time")
    parser.add_argument("--paired", action="store_true",
                        help="instead: time the whole decode program before vs after, interleaved")
    parser.add_argument("--compaction", action="store_true",
                        help="instead: time the decode program with vs without dropping finished rows")
    parser.add_argument("--fills", default="0.5", help="fractions of the KV cache filled for the phase profile")
    parser.add_argument("--variants", default="windowed",
                        help=f"cache reads to profile, of {','.join(CACHE_WINDOWS)} (comma-separated)")
    parser.add_argument("--no-loop", action="store_true", help="skip the in-loop step (slow at long lengths)")
    parser.add_argument("--lever", choices=sorted(LEVERS), default=None,
                        help="instead: time the decode program without / with one change, interleaved")
    parser.add_argument("--xla-variants", default=None,
                        help=f"instead: time the decode program per XLA:CPU option set, of {','.join(XLA_VARIANTS)}")
    args = parser.parse_args(argv)
    from jaxrl_llm.benchmarks.rollout import chat_prompts
    from jaxrl_llm.bridge import load_hf_dir, smollm2_hf_dir

    hf_dir = smollm2_hf_dir()
    cfg, params = load_hf_dir(hf_dir)
    prompts = chat_prompts(hf_dir, 8)
    cache_len = args.prompt_len + args.max_tokens
    results = {}
    for batch in (int(b) for b in args.batches.split(",")):
        if args.lever:
            r = results[batch] = paired_lever(cfg, params, prompts, batch, args.max_tokens, args.rounds, args.lever)
            print(f"batch {batch}, <= {args.max_tokens} tokens, lever {args.lever} (load "
                  f"{os.getloadavg()[0]:.1f}): before {r['before']:.2f} s, after {r['after']:.2f} s, speed-up "
                  f"{r['before'] / r['after']:.2f}x; compile+first call {r['before compile+first']:.1f} s -> "
                  f"{r['after compile+first']:.1f} s", flush=True)
            continue
        if args.xla_variants:
            names = ["default"] + [n for n in args.xla_variants.split(",") if n != "default"]
            r = results[batch] = xla_variants(cfg, params, prompts, batch, args.max_tokens, args.rounds, names)
            print(f"batch {batch}, {args.max_tokens} tokens (load {os.getloadavg()[0]:.1f}): "
                  + ", ".join(f"{k} {v:.2f} s ({r['default'] / v:.2f}x)" for k, v in r.items()), flush=True)
            continue
        if args.compaction:
            r = results[batch] = paired_compaction(cfg, params, prompts, batch, args.max_tokens, args.rounds)
            print(f"batch {batch}, <= {args.max_tokens} tokens (load {os.getloadavg()[0]:.1f}): all rows "
                  f"{r['all rows']:.2f} s, compacted {r['compacted']:.2f} s, "
                  f"speed-up {r['all rows'] / r['compacted']:.2f}x", flush=True)
            continue
        if args.paired:
            r = results[batch] = paired_generate(cfg, params, prompts, batch, args.max_tokens, args.rounds)
            print(f"batch {batch}, {args.max_tokens} tokens (load {os.getloadavg()[0]:.1f}): before "
                  f"{r['before']:.2f} s, after {r['after']:.2f} s, speed-up {r['before'] / r['after']:.2f}x",
                  flush=True)
            continue
        r = results[batch] = profile(cfg, params, prompts, batch, cache_len, args.max_tokens, args.rounds,
                                     SAMPLERS[args.sampler], tuple(float(f) for f in args.fills.split(",")),
                                     tuple(v.strip() for v in args.variants.split(",")), not args.no_loop)
        print(f"batch {batch}, cache {cache_len} (load {os.getloadavg()[0]:.1f}): "
              + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in r.items()), flush=True)
    return results


if __name__ == "__main__":
    main()
