"""In-process JAX sampler: jit-compiled prefill and KV-cache decode.

The rollout engine that needs no server. It returns the same `RolloutBatch` as
the vLLM client, so the learner cannot tell the two apart.

Sampling distribution and the logprobs it reports. For each step the logits
are divided by the temperature, optionally restricted to the top-k tokens and
then to the smallest nucleus of mass >= top_p (Holtzman et al. 2020), and
renormalised; the token is drawn from that distribution by inversion (one
uniform number per row against the cumulative probabilities,
`inverse_cdf_choice`) and its log-probability *under that same distribution* is recorded.
With top_p = 1 and top_k off (the RL default; docs/objectives.md#sampler-support) this is
log_softmax(logits / T), i.e. vLLM's ``processed_logprobs``, and the learner's
recomputed logprobs at the same temperature should match it up to numerics.

Padding convention (see `jaxrl_llm.models.decoder`): prompts are left-padded
to a common width, so every row's next token is written at the same cache
slot. Prompt widths and batch sizes are rounded up to buckets so a training
run compiles a handful of programs, not one per step.

Determinism: with ``SamplingParams.seed`` set, the same prompts, params and
seed give the same samples (the key for step t is fold_in(seed_key, t)), and
``SamplingParams.first_row`` lets a batch split over calls or processes draw
the samples of one call (the uniform of a row depends on its global index).

Work: the decode is one jitted ``lax.while_loop`` that exits when every row
has stopped, and rows that have stopped leave the loop's batch (steps of 3/4,
`compaction_sizes`; for long generations down to one row), so a batch whose
completions end at different lengths is not computed at full width to the
longest one. Each step's attention reads only the filled part of the KV cache,
in windows of ``cache_window`` slots (`jaxrl_llm.models.attention.windowed_cache_attention`),
so a step costs what the sequence so far needs, not what max_tokens reserves. That design was
tuned for a 2-core CPU; on accelerators its 12 loops x cache-window branches take minutes to
compile per batch size, and ``decode="auto"`` takes `rollout.decode_slots` instead (fixed slots
refilled from the call's queue, one loop; same samples: the draw is `rollout.sampling`'s).

Routing (``return_routed_experts``, MoE policies): both paths run the prefill and each decode step with
``forward(..., return_routing=True)`` and keep the experts of every forwarded token, by output row (so
compaction and refills move nothing), for `RolloutRecord.routed_experts` (`rollout.sampler_routing`).
"""
from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models import DecoderConfig, batch_invariant as invariant, forward, init_cache, lm_head_logits
from jaxrl_llm.models.decode_attention import resolve_decode_kernel
from jaxrl_llm.models.platform import target_platform
from jaxrl_llm.rollout.decode_slots import generate_slots
from jaxrl_llm.rollout.sampler_mesh import SamplerLayout
from jaxrl_llm.rollout.sampler_routing import (SampledRouting, check_routing_option, empty_completion_experts,
                                               record_step, sample_routed_experts)
from jaxrl_llm.rollout.sampling import (draw, filtered_logprobs,  # noqa: F401  (importable from here)
                                        inverse_cdf_choice)
from jaxrl_llm.rollout.types import RolloutBatch, RolloutRecord, SamplingParams

def _round_up(value: int, multiple: int) -> int:
    return max(multiple, int(math.ceil(value / multiple)) * multiple)


class _Decode(NamedTuple):
    """State of the decode loop. ``rows`` [b] maps the b rows still computed to their
    row in the outputs (b shrinks when finished rows are dropped); out_* are [B, ...]."""
    step: jax.Array
    cache: dict
    logits: jax.Array
    rows: jax.Array
    done: jax.Array
    out_tokens: jax.Array
    out_logprobs: jax.Array
    out_lengths: jax.Array
    out_stopped: jax.Array
    out_experts: jax.Array | None = None  # [B, max_tokens, nL, k] (record_routing; sampler_routing)


def compaction_sizes(batch: int, smallest: int = 8, compactions: int = 12) -> tuple[int, ...]:
    """Row counts the decode loop runs at: the batch, then steps of x3/4 (or x2/3, x1/2 where
    3/4 of it is not whole: 64, 48, 36, 27, 18, 12, 9, 6, 4, 3, 2, 1), not below ``smallest``,
    at most ``compactions`` steps (each size is one more decode loop to compile). Steps of 3/4
    rather than halvings leave fewer finished rows computing in the batch, at the price of more
    loops to compile (measurements: docs/benchmarks.md)."""
    if smallest < 1 or compactions < 0:
        raise ValueError(f"smallest ({smallest}) must be >= 1 and compactions ({compactions}) >= 0")
    sizes = [batch]
    while len(sizes) <= compactions:
        size = sizes[-1]
        step = next((size * k // d for k, d in ((3, 4), (2, 3), (1, 2)) if size % d == 0), None)
        if step is None or step < smallest:
            break
        sizes.append(step)
    return tuple(sizes)


def _keep_unfinished(state: _Decode, size: int) -> _Decode:
    """The first ``size`` rows after a stable sort putting unfinished rows first (the
    caller guarantees at most ``size`` are unfinished); the cache rows go with them."""
    keep = jnp.argsort(state.done, stable=True)[:size]
    cache = dict(state.cache, k=state.cache["k"][:, keep], v=state.cache["v"][:, keep],
                 mask=state.cache["mask"][keep], next_pos=state.cache["next_pos"][keep])
    return state._replace(cache=cache, logits=state.logits[keep], rows=state.rows[keep], done=state.done[keep])


def _spread_prompt_cache(cache: dict, source_rows: jax.Array, max_tokens: int) -> dict:
    """The prefilled cache of the distinct prompts [.., P, Lp, ..] -> the decode cache of
    every row [.., B, Lp + max_tokens, ..]: row i holds prompt ``source_rows[i]``, and
    ``max_tokens`` empty slots follow the prompt."""
    grow = ((0, 0), (0, 0), (0, max_tokens), (0, 0), (0, 0))
    return {"k": jnp.pad(cache["k"][:, source_rows], grow), "v": jnp.pad(cache["v"][:, source_rows], grow),
            "mask": jnp.pad(cache["mask"][source_rows], ((0, 0), (0, max_tokens))), "end": cache["end"],
            "next_pos": cache["next_pos"][source_rows]}


@functools.partial(jax.jit, static_argnames=("cfg", "max_tokens", "top_k", "use_top_p", "first_row", "compact",
                                             "min_rows", "compactions", "cache_window",
                                             "batch_invariant", "record_routing", "layout"))
def _generate(params, cfg: DecoderConfig, prompt_tokens, prompt_mask, key, temperature, top_p, stop_ids,
              source_rows=None, live=None, *, max_tokens: int, top_k: int | None, use_top_p: bool,
              first_row: int = 0, compact: bool = True, min_rows: int = 8, compactions: int = 12,
              cache_window: int | None = None, batch_invariant: bool = False, record_routing: bool = False,
              layout: SamplerLayout | None = None):
    """prompt_tokens/prompt_mask [P, Lp] left-padded distinct prompts -> (tokens [B, max_tokens],
    logprobs [B, max_tokens], lengths [B], stopped [B]) for B = len(source_rows) rows, row i
    continuing prompt ``source_rows[i]`` (default: one row per prompt). Each distinct prompt
    is prefilled once and its cache copied to its rows (n samples of a prompt cost one
    prefill, as with vLLM's prefix caching). Rows with ``live`` False (batch filler) start
    finished: they are never sampled and leave the loop at its first compaction.

    With ``compact``, finished rows stop being computed: the loop runs at B rows while
    more than the next size (3/4 B) are unfinished, then moves the unfinished rows (and
    their cache) into a loop of that size, and so on through `compaction_sizes` (at most
    ``compactions`` steps, not below ``min_rows`` rows). A row's numbers do not depend on
    which rows share its batch (its uniform is indexed by its output row), so compaction
    changes the work, not the samples (up to matmul rounding). ``cache_window`` (slots; None: the whole cache):
    decode steps attend over the filled windows of the cache only (same numbers).
    ``batch_invariant``: prompts are RIGHT-padded, the model runs `models.batch_invariant`'s ops
    (each token at cache slot = its position) and the loop carries log pi(. | row) from
    `models.batch_invariant.head_logprobs` instead of logits: every number of a row is then
    independent of its batch and equal to the learner's (``forward(batch_invariant=True)``).
    ``record_routing`` (MoE configs): a fifth output, `sampler_routing.SampledRouting` (the experts of the
    prefill and of every decode step's input token).
    ``layout``: the sampler's mesh layout (`rollout.sampler_mesh`): rows over "data", where they divide it."""
    unique, prompt_len = prompt_tokens.shape
    source_rows = jnp.arange(unique, dtype=jnp.int32) if source_rows is None else source_rows
    batch = source_rows.shape[0]
    live = jnp.ones((batch,), bool) if live is None else live
    greedy = temperature == 0.0  # the most likely token; logprobs at temperature 1
    scale = jnp.where(greedy, 1.0, temperature)
    cache = init_cache(cfg, unique, prompt_len)
    prefilled = forward(params, cfg, prompt_tokens, attention_mask=prompt_mask, cache=cache, return_hidden=True,
                        batch_invariant=batch_invariant, return_routing=record_routing)
    hidden, cache = prefilled[0], prefilled[1]
    if batch_invariant:  # right-padded prompts: the last real token of each; the loop carries log-probs
        tied = cfg.tie_word_embeddings
        head = functools.partial(invariant.head_logprobs, weight=params["embed" if tied else "lm_head"], tied=tied,
                                 temperature=scale)
        last_hidden = hidden[jnp.arange(unique), jnp.sum(prompt_mask, axis=1) - 1]
    else:
        head = functools.partial(lm_head_logits, params=params, cfg=cfg)
        last_hidden = hidden[:, -1]
    last_logits = head(last_hidden)[source_rows]
    cache = _spread_prompt_cache(cache, source_rows, max_tokens)

    def sample(logits, rows, step):
        # Rows first_row.. of a [first_row + B] draw: with JAX's partitionable threefry an
        # element's value depends on its index only, so a split batch draws the numbers of one call.
        uniform = jax.random.uniform(jax.random.fold_in(key, step), (first_row + batch,))[first_row:]
        return draw(logits, uniform[rows], greedy, scale, top_k, top_p, use_top_p, batch_invariant)

    def body(s: _Decode) -> _Decode:
        token, logp = sample(s.logits, s.rows, s.step)
        active = ~s.done
        out_row = jnp.where(active, s.rows, batch)  # finished rows write nowhere (dropped)
        stopped = active & jnp.any(token[:, None] == stop_ids[None, :], axis=-1)
        stepped = forward(params, cfg, token[:, None], attention_mask=active[:, None], cache=s.cache,
                          return_hidden=True, cache_window=cache_window, batch_invariant=batch_invariant,
                          return_routing=record_routing)
        experts = record_step(s.out_experts, out_row, s.step, stepped[2].experts) if record_routing else None
        return _Decode(s.step + 1, _on_mesh(stepped[1], layout), head(stepped[0][:, 0]), s.rows, s.done | stopped,
                       s.out_tokens.at[out_row, s.step].set(token, mode="drop"),
                       s.out_logprobs.at[out_row, s.step].set(logp, mode="drop"),
                       s.out_lengths.at[out_row].add(1, mode="drop"),
                       s.out_stopped.at[out_row].set(stopped, mode="drop"), experts)

    state = _Decode(jnp.zeros((), jnp.int32), _on_mesh(cache, layout), last_logits,
                    jnp.arange(batch, dtype=jnp.int32), ~live,
                    jnp.zeros((batch, max_tokens), jnp.int32), jnp.zeros((batch, max_tokens), jnp.float32),
                    jnp.zeros((batch,), jnp.int32), jnp.zeros((batch,), bool),
                    empty_completion_experts(cfg, batch, max_tokens) if record_routing else None)
    sizes = compaction_sizes(batch, min_rows, compactions) if compact else (batch,)
    for size, next_size in zip(sizes, sizes[1:] + (0,)):
        if size != batch:
            state = _keep_unfinished(state, size)

        def cond(s: _Decode, next_size=next_size) -> jax.Array:
            return (s.step < max_tokens) & (jnp.sum(~s.done) > next_size)

        state = jax.lax.while_loop(cond, body, state)
    out = state.out_tokens, state.out_logprobs, state.out_lengths, state.out_stopped
    if not record_routing:
        return out
    return out + (SampledRouting(prefilled[2].experts.astype(state.out_experts.dtype), state.out_experts),)


def _on_mesh(cache: dict, layout: SamplerLayout | None) -> dict:
    """The decode cache in the sampler's layout (None: as XLA places it): rows over "data", KV heads over "tensor"."""
    if layout is None:
        return cache
    return dict(cache, k=layout.cache(cache["k"]), v=layout.cache(cache["v"]), mask=layout.rows(cache["mask"]),
                next_pos=layout.rows(cache["next_pos"]))


DECODE_PATHS = ("auto", "compact", "slots")


def decode_path(name: str, backend: str | None = None) -> str:
    """The decode path ``name`` stands for on ``backend`` (default: JAX's): "auto" is "slots" on
    accelerators (GPU, TPU) and "compact" on CPU, whose batch shrinking was tuned for 2 cores."""
    if name not in DECODE_PATHS:
        raise ValueError(f"decode {name!r} is not one of {DECODE_PATHS}")
    if name != "auto":
        return name
    return "compact" if (backend or target_platform()) == "cpu" else "slots"


class JaxSampler:
    """A `RolloutEngine` running the policy in this process.

    Args:
      cfg: the model config.
      params: the policy params (any dtype; cast to cfg.param_dtype is the caller's choice).
      eos_token_ids: ids that end a completion (the tokenizer's EOS, chat end-of-turn).
      pad_id: id used for left padding of prompts (never attended to).
      prompt_bucket, batch_bucket: widths and batch sizes are rounded up to
        multiples of these, so few programs are compiled.
      initial_version: version of `params` (a resumed run passes its own).
      cache_window: decode steps attend over the filled prefix of the KV cache in windows
        of this many slots (None: always the whole cache; same samples either way).
      long_generation: from this many max_tokens on, finished rows are compacted away down
        to a single row (below it, down to 8 rows: fewer loops to compile for short calls).
      compactions: at most this many shrink steps of the decode batch (`compaction_sizes`).
      batch_invariant: each row's samples and log-probs bitwise independent of its batch, equal to
        the learner's ``forward(batch_invariant=True)`` (`_generate`); top_p = 1 and top_k off only.
      decode: "compact" (`_generate`: the batch shrinks as rows finish; made for CPUs), "slots"
        (`rollout.decode_slots`: fixed slots refilled with the call's queued samples, one loop to
        compile; made for accelerators) or "auto" (`decode_path`: slots on GPU/TPU, compact on CPU).
        Both draw the same samples.
      decode_slots: slots of the slot decode (None: one per row of the call, rounded to batch_bucket).
      decode_kernel: the slot decode's attention (`models.decode_attention.DECODE_KERNELS`).
      return_routed_experts: fill each record's ``routed_experts`` (int32 [P + L - 1, nL, k], the experts
        every MoE layer routed each forwarded token to; `rollout.sampler_routing`). MoE configs only;
        off, nothing about routing is compiled.
      mesh: the sampler's own ("data", "tensor") mesh (`rollout.sampler_mesh`; `rollout.mesh`): params are
        placed there in its tensor-parallel layout once per weight version (here and in update_weights), decode
        rows split over "data". None: the params decode in the layout they arrive in.
    """

    def __init__(self, cfg: DecoderConfig, params: Any, *, eos_token_ids: Sequence[int], pad_id: int = 0,
                 prompt_bucket: int = 16, batch_bucket: int = 8, initial_version: int = 0,
                 cache_window: int | None = 32, long_generation: int = 128, compactions: int = 12,
                 batch_invariant: bool = False, decode: str = "auto", decode_slots: int | None = None,
                 decode_kernel: str = "auto", return_routed_experts: bool = False,
                 mesh: jax.sharding.Mesh | None = None):
        if not eos_token_ids:
            raise ValueError("eos_token_ids must name at least one stop token id")
        if cache_window is not None and cache_window < 1:
            raise ValueError(f"cache_window must be >= 1 slot or None, got {cache_window}")
        if long_generation < 1 or compactions < 0:
            raise ValueError(f"long_generation ({long_generation}) must be >= 1 and compactions ({compactions}) >= 0")
        self.cache_window = cache_window
        self.batch_invariant = bool(batch_invariant)
        self.decode = decode_path(decode)
        if decode_slots is not None and decode_slots < 1:
            raise ValueError(f"decode_slots must be >= 1 or None, got {decode_slots}")
        self.decode_slots = decode_slots
        self.decode_kernel = resolve_decode_kernel(decode_kernel)
        self.long_generation = int(long_generation)
        self.compactions = int(compactions)
        self.cfg = cfg
        self.return_routed_experts = check_routing_option(cfg, return_routed_experts)
        if mesh is not None and self.batch_invariant:
            raise ValueError("a sampler mesh with batch_invariant=True: batch-invariant sampling runs on one device; "
                             "valid: mesh=None, or batch_invariant=False")
        self.layout = None if mesh is None else SamplerLayout.plan(cfg, mesh, self.decode)
        self._model = cfg if mesh is None else self.layout.model_config(cfg)  # KV heads as the layout stores them
        self._place = None if mesh is None else self.layout.placer(cfg, params)
        self.params = self._placed(params)
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.pad_id = int(pad_id)
        self.prompt_bucket = int(prompt_bucket)
        self.batch_bucket = int(batch_bucket)
        self._version = int(initial_version)

    @property
    def weight_version(self) -> int:
        return self._version

    def _placed(self, params: Any) -> Any:
        """The params as the decode reads them, made once per weight version: on the sampler's mesh in its layout
        (`SamplerLayout.placer`); batch_invariant: on one device, so the program is not partitioned (a learner's
        FSDP-sharded params would split the contractions over devices and sum in another order)."""
        if self._place is not None:
            return self._place(params)
        return jax.device_put(params, jax.local_devices()[0]) if self.batch_invariant else params

    def update_weights(self, params: Any) -> int:
        """Swap in new params (no recompilation: params are a jit argument; batch_invariant: onto one device)."""
        self.params = self._placed(params)
        self._version += 1
        return self._version

    def generate(self, prompts_token_ids: Sequence[Sequence[int]], n: int, params: SamplingParams) -> RolloutBatch:
        if n < 1:
            raise ValueError(f"n (samples per prompt) must be >= 1, got {n}")
        prompts = [np.asarray(p, np.int32) for p in prompts_token_ids]
        if not prompts or any(p.ndim != 1 or p.size == 0 for p in prompts):
            raise ValueError("prompts_token_ids must be a non-empty list of non-empty token id lists")
        longest = max(p.size for p in prompts)
        if longest + params.max_tokens > self.cfg.max_position_embeddings:
            raise ValueError(f"prompt length {longest} + max_tokens {params.max_tokens} exceeds the model's "
                             f"max_position_embeddings {self.cfg.max_position_embeddings}")
        rows = [p for p in prompts for _ in range(n)]
        width = _round_up(longest, self.prompt_bucket)
        batch = _round_up(len(rows), self.batch_bucket)
        tokens = np.full((_round_up(len(prompts), self.batch_bucket), width), self.pad_id, np.int32)
        mask = np.zeros(tokens.shape, bool)
        if self.batch_invariant and (params.top_k is not None or params.top_p < 1.0):
            raise ValueError(f"batch_invariant sampling needs top_p = 1 and top_k = None (the learner's full softmax), "
                             f"got top_p={params.top_p}, top_k={params.top_k}")
        right = self.batch_invariant or self.decode == "slots"
        start = (lambda p: 0) if right else (lambda p: width - p.size)  # right- or left-padded
        for i, p in enumerate(prompts):
            tokens[i, start(p):start(p) + p.size] = p
            mask[i, start(p):start(p) + p.size] = True
        mask[len(prompts):, 0 if right else -1] = True  # filler prompts: one visible token
        source_rows = np.minimum(np.arange(batch) // n, len(prompts) - 1).astype(np.int32)
        live = np.arange(batch) < len(rows)
        if params.first_row and not jax.config.jax_threefry_partitionable:
            raise ValueError("SamplingParams.first_row > 0 needs jax_threefry_partitionable=True (JAX's default "
                             "since 0.5) so that a row's noise does not depend on the batch size")
        # ignore_eos: only the request's own stop tokens end a row (-1, never sampled, keeps the array non-empty)
        stop = sorted(set(() if params.ignore_eos else self.eos_token_ids) | set(params.stop_token_ids)) or [-1]
        seed = 0 if params.seed is None else params.seed
        if params.seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0])
        args = (self.params, self._model, jnp.asarray(tokens), jnp.asarray(mask), jax.random.key(seed),
                jnp.float32(params.temperature), jnp.float32(params.top_p), jnp.asarray(stop, jnp.int32),
                jnp.asarray(source_rows))
        options = dict(max_tokens=params.max_tokens, top_k=params.top_k, use_top_p=params.top_p < 1.0,
                       first_row=int(params.first_row), batch_invariant=self.batch_invariant,
                       record_routing=self.return_routed_experts, layout=self.layout)
        if self.decode == "slots":
            out = generate_slots(*args, jnp.int32(len(rows)), slots=min(batch, self.decode_slots or batch),
                                 kernel=self.decode_kernel, **options)
        else:
            out = _generate(*args, jnp.asarray(live), compactions=self.compactions, cache_window=self.cache_window,
                            min_rows=1 if params.max_tokens >= self.long_generation else 8, **options)
        out_tokens, out_logprobs, lengths, stopped, *routing = jax.device_get(out)
        records = []
        for i, prompt in enumerate(rows):
            length = int(lengths[i])
            experts = None
            if routing:  # the prompt's real rows (shared by its n samples), then the completion's
                prompt_rows = routing[0].prompt[i // n, start(prompt):start(prompt) + prompt.size]
                experts = sample_routed_experts(prompt_rows, routing[0].completion[i], length)
            records.append(RolloutRecord(
                prompt_index=i // n, sample_index=i % n, prompt_token_ids=prompt,
                completion_token_ids=out_tokens[i, :length], sampler_logprobs=out_logprobs[i, :length],
                finish_reason="stop" if stopped[i] else "length", weight_version=self._version,
                routed_experts=experts))
        return RolloutBatch(records=tuple(records), num_prompts=len(prompts), samples_per_prompt=n)
