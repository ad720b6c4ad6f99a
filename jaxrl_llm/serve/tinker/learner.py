"""Tinker's training calls on one base model: forward, forward_backward (gradients summed into the
model's accumulator, as Tinker does until the next optim_step) and optim_step (AdamW with the
call's AdamParams, then the accumulator is cleared).

forward and forward_backward run several clients' calls as one forward (`run`): each call's datums
are right-padded to a common width (a multiple of WIDTH_BUCKET) and its rows to a multiple of
BATCH_BUCKET, the calls' row blocks are stacked, and the decoder applies each client's LoRA
adapters, unmerged, to its own block only (`models.lora.GroupedLora`); the LM head's adapter is
merged per block. Each call's loss is its own loss function on its own rows, and the gradient of
their sum with respect to one client's adapters is that client's gradient alone (no other row
depends on them). A single call is the batch of one. Padding positions are masked out of the
loss, and causal attention keeps them from touching real positions.

Micro-batches: the stacked rows of a run are cut, in order, into micro-batches of at most
`micro_batch_tokens` padded tokens (rows x width; `micro_batches`), run one after another: a call
may be split across micro-batches and a micro-batch may hold pieces of several calls. Losses are
sums over tokens, so a call's loss is the sum of its pieces' and its gradient the sum of theirs
(added to model.grads as they come); its outputs are its pieces' rows in order. A run that fits
the budget is one micro-batch.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_llm.models import DecoderConfig, chunked_logprobs_from_hidden, forward
from jaxrl_llm.models.lora import GroupedLora
from jaxrl_llm.serve.tinker import losses
from jaxrl_llm.serve.tinker.adapters import AdapterConfig, group_factors, with_head
from jaxrl_llm.serve.tinker.wire import Datum

WIDTH_BUCKET = 32
BATCH_BUCKET = 4
# SmolLM2-135M, one forward_backward of 32 datums x 64 tokens: peak RSS 5.8 GB in one micro-batch,
# 2.7 GB at 512 (docs/tinker.md, "How it runs, and its limits").
MICRO_BATCH_TOKENS = 512
ADAM_FIELDS = ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")


@dataclasses.dataclass
class TrainingModel:
    """One client's model: its adapters, optimiser state and the gradients summed since the last step."""

    model_id: str
    base_model: str
    config: AdapterConfig
    adapters: dict
    opt_state: Any
    grads: dict | None = None
    steps: int = 0


@dataclasses.dataclass(frozen=True)
class TrainCall:
    """One forward / forward_backward call of one client."""

    model: TrainingModel
    loss_fn: str
    config: Mapping[str, float | str]
    data: tuple[Datum, ...]


@dataclasses.dataclass(frozen=True)
class Batch:
    """One call's datums as padded arrays."""

    tokens: np.ndarray  # int32 [B, W]
    targets: np.ndarray  # int32 [B, W]
    inputs: dict[str, np.ndarray]  # float32 [B, W] each
    valid: np.ndarray  # bool [B, W]
    lengths: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Group:
    """The static part of one call in a combined forward: its rows, loss and LoRA scale."""

    rows: int
    loss_fn: str
    config: tuple[tuple[str, Any], ...]
    scale: float


@dataclasses.dataclass(frozen=True)
class Piece:
    """Datums [start, stop) of a run's call number `call`: its part of one micro-batch."""

    call: int
    start: int
    stop: int


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def micro_batches(sizes: Sequence[int], rows: int) -> list[list[Piece]]:
    """Calls of sizes[i] datums, in order, cut into micro-batches of at most `rows` padded rows (a
    multiple of BATCH_BUCKET; each piece's rows are rounded up to BATCH_BUCKET)."""
    if rows < BATCH_BUCKET or rows % BATCH_BUCKET:
        raise ValueError(f"micro-batch rows={rows}; valid: a positive multiple of {BATCH_BUCKET}")
    batches: list[list[Piece]] = [[]]
    left = rows
    for call, n in enumerate(sizes):
        start = 0
        while start < n:
            if left == 0:
                batches, left = batches + [[]], rows
            stop = min(n, start + left)
            batches[-1].append(Piece(call, start, stop))
            left -= _round_up(stop - start, BATCH_BUCKET)
            start = stop
    return batches


def padded_width(data: Sequence[Datum]) -> int:
    """The width a call's datums are padded to (calls of one width can share a forward)."""
    return _round_up(max((d.tokens.size for d in data), default=1), WIDTH_BUCKET)


def padded_tokens(data: Sequence[Datum]) -> int:
    """Rows x width of a call's padded arrays: what it adds to a combined forward."""
    return _round_up(len(data), BATCH_BUCKET) * padded_width(data)


def check_datum(datum: Datum, index: int, needed: tuple[str, ...], vocab_size: int, max_len: int) -> None:
    """ValueError naming the datum and its bad field: token ids out of range, missing or extra
    inputs, inputs of another length than the tokens."""
    n = datum.tokens.size
    if not 1 <= n <= max_len:
        raise ValueError(f"datum {index}: model_input has {n} tokens; valid: 1 to {max_len}")
    expected = {"target_tokens", *needed}
    missing, extra = sorted(expected - set(datum.inputs)), sorted(set(datum.inputs) - expected)
    if missing or extra:
        raise ValueError(f"datum {index}: loss_fn_inputs has {sorted(datum.inputs)}, missing {missing}, "
                         f"unexpected {extra}; valid: {sorted(expected)}")
    for name, array in datum.inputs.items():
        if array.shape != (n,):
            raise ValueError(f"datum {index}: loss_fn_inputs[{name!r}] has shape {list(array.shape)}; "
                             f"valid: [{n}] (one value per model_input token)")
        if not np.all(np.isfinite(array)):
            raise ValueError(f"datum {index}: loss_fn_inputs[{name!r}] holds NaN or inf")
    for name, ids in (("model_input", datum.tokens), ("target_tokens", datum.inputs["target_tokens"])):
        if ids.min() < 0 or ids.max() >= vocab_size:
            raise ValueError(f"datum {index}: {name} holds token id {int(ids.min() if ids.min() < 0 else ids.max())}; "
                             f"valid: 0 to {vocab_size - 1}")


def make_batch(data: tuple[Datum, ...], needed: tuple[str, ...], width: int) -> Batch:
    lengths = tuple(d.tokens.size for d in data)
    shape = (_round_up(len(data), BATCH_BUCKET), width)
    tokens, targets, valid = np.zeros(shape, np.int32), np.zeros(shape, np.int32), np.zeros(shape, bool)
    inputs = {name: np.zeros(shape, np.float32) for name in needed}
    for row, (datum, n) in enumerate(zip(data, lengths)):
        tokens[row, :n], targets[row, :n], valid[row, :n] = datum.tokens, datum.inputs["target_tokens"], True
        for name in needed:
            inputs[name][row, :n] = datum.inputs[name]
    return Batch(tokens, targets, inputs, valid, lengths)


def _objective(adapters, base, tokens, targets, inputs, valid, *, cfg, groups):
    """sum of every call's loss, and per call (total [G], logp and per-token loss [B, W])."""
    factors = tuple(group_factors(a, g.scale) for a, g in zip(adapters, groups))
    hidden, _ = forward(base, cfg, tokens, return_hidden=True,
                        lora=GroupedLora(factors, tuple(g.rows for g in groups)))
    totals, logps, per_tokens, start = [], [], [], 0
    for own, group, own_inputs in zip(adapters, groups, inputs):
        rows = slice(start, start + group.rows)
        start += group.rows
        logp = chunked_logprobs_from_hidden(hidden[rows], targets[rows], with_head(base, own, group.scale), cfg)
        total, per_token = losses.total_loss(losses.LOSSES[group.loss_fn], logp, own_inputs, dict(group.config),
                                             valid[rows])
        totals, logps, per_tokens = totals + [total], logps + [logp], per_tokens + [per_token]
    return sum(totals), (jnp.stack(totals), jnp.concatenate(logps), jnp.concatenate(per_tokens))


@functools.partial(jax.jit, static_argnames=("cfg", "groups"))
def _forward(adapters, base, tokens, targets, inputs, valid, *, cfg, groups):
    _, (totals, logp, per_token) = _objective(adapters, base, tokens, targets, inputs, valid, cfg=cfg, groups=groups)
    return totals, logp, per_token, None


@functools.partial(jax.jit, static_argnames=("cfg", "groups"))
def _forward_backward(adapters, base, tokens, targets, inputs, valid, *, cfg, groups):
    objective = functools.partial(_objective, cfg=cfg, groups=groups)
    (_, (totals, logp, per_token)), grads = jax.value_and_grad(objective, has_aux=True)(
        adapters, base, tokens, targets, inputs, valid)
    return totals, logp, per_token, grads


_add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b))


def new_optimizer_state(adapters: dict) -> Any:
    return _adamw().init(adapters)


def _adamw() -> optax.GradientTransformation:
    return optax.inject_hyperparams(optax.adamw)(learning_rate=1e-4, b1=0.9, b2=0.95, eps=1e-12, weight_decay=0.0)


@jax.jit
def _adam_update(adapters, opt_state, grads, hyper):
    norm = optax.global_norm(grads)
    clip = hyper["grad_clip_norm"]
    adam = {k: v for k, v in hyper.items() if k != "grad_clip_norm"}
    factor = jnp.where(clip > 0, jnp.minimum(1.0, clip / jnp.maximum(norm, 1e-30)), 1.0)
    grads = jax.tree.map(lambda g: g * factor, grads)
    opt_state = opt_state._replace(hyperparams={**opt_state.hyperparams, **adam})
    updates, opt_state = _adamw().update(grads, opt_state, adapters)
    return optax.apply_updates(adapters, updates), opt_state, norm


class Learner:
    """The training calls of one base model (cfg and params shared by every client's adapters).
    `forwards` counts the runs by their number of calls, `micro_batch_counts` by their number of
    micro-batches (module docstring)."""

    def __init__(self, cfg: DecoderConfig, base: dict, micro_batch_tokens: int = MICRO_BATCH_TOKENS):
        if micro_batch_tokens < 1:
            raise ValueError(f"micro_batch_tokens={micro_batch_tokens}; valid: >= 1 (padded tokens, rows x width)")
        self.cfg, self.base, self.micro_batch_tokens = cfg, base, micro_batch_tokens
        self.forwards: collections.Counter[int] = collections.Counter()
        self.micro_batch_counts: collections.Counter[int] = collections.Counter()

    def check(self, call: TrainCall, backward: bool) -> None:
        """ValueError naming the call's bad loss, config or datum."""
        loss = losses.check_loss(call.loss_fn, call.config)
        if not call.data:
            raise ValueError(f"{'forward_backward' if backward else 'forward'} with no datums; valid: at least one")
        for i, datum in enumerate(call.data):
            check_datum(datum, i, loss.inputs, self.cfg.vocab_size, self.cfg.max_position_embeddings)

    def micro_batch_rows(self, width: int) -> int:
        """Rows of one micro-batch at this width: the budget's, a multiple of BATCH_BUCKET, at least one bucket."""
        return max(BATCH_BUCKET, self.micro_batch_tokens // width // BATCH_BUCKET * BATCH_BUCKET)

    def run(self, calls: Sequence[TrainCall], *, backward: bool
            ) -> list[tuple[dict[str, list[np.ndarray]], dict[str, float]]]:
        """forward (backward=False) or forward_backward of calls of distinct models (each checked
        with `check` first), in micro-batches: per call, per-datum "logprobs" and "elementwise_loss"
        [N] and the metrics {"loss:sum"}; with backward, each call's gradients join its model.grads."""
        width = max(padded_width(c.data) for c in calls)
        batches = micro_batches([len(c.data) for c in calls], self.micro_batch_rows(width))
        totals = [0.0] * len(calls)
        outputs = [{"logprobs": [], "elementwise_loss": []} for _ in calls]
        for pieces in batches:
            for piece, total, logp, per_token in self._run_pieces(calls, pieces, width, backward):
                totals[piece.call] += total
                outputs[piece.call]["logprobs"] += logp
                outputs[piece.call]["elementwise_loss"] += per_token
        self.forwards[len(calls)] += 1
        self.micro_batch_counts[len(batches)] += 1
        return [(out, {"loss:sum": total}) for out, total in zip(outputs, totals)]

    def _run_pieces(self, calls: Sequence[TrainCall], pieces: list[Piece], width: int, backward: bool
                    ) -> list[tuple[Piece, float, list[np.ndarray], list[np.ndarray]]]:
        """One micro-batch as one forward: per piece its loss and per-datum log-probs and per-token
        losses; with backward, each piece's gradient is added to its model's."""
        own = [calls[p.call] for p in pieces]
        batches = [make_batch(c.data[p.start:p.stop], losses.LOSSES[c.loss_fn].inputs, width)
                   for c, p in zip(own, pieces)]
        groups = tuple(Group(b.tokens.shape[0], c.loss_fn, tuple(sorted(c.config.items())), c.model.config.scale)
                       for c, b in zip(own, batches))
        stacked = [jnp.asarray(np.concatenate([getattr(b, f) for b in batches])) for f in ("tokens", "targets")]
        inputs = tuple({k: jnp.asarray(v) for k, v in b.inputs.items()} for b in batches)
        valid = jnp.asarray(np.concatenate([b.valid for b in batches]))
        program = _forward_backward if backward else _forward
        totals, logp, per_token, grads = program(tuple(c.model.adapters for c in own), self.base, *stacked,
                                                 inputs, valid, cfg=self.cfg, groups=groups)
        totals, logp, per_token = np.asarray(totals), np.asarray(logp), np.asarray(per_token)
        results, start = [], 0
        for i, (call, piece, batch, group) in enumerate(zip(own, pieces, batches, groups)):
            if backward:
                call.model.grads = grads[i] if call.model.grads is None else _add(call.model.grads, grads[i])
            rows = range(start, start + len(batch.lengths))
            start += group.rows
            results.append((piece, float(totals[i]), [logp[r, :n] for r, n in zip(rows, batch.lengths)],
                            [per_token[r, :n] for r, n in zip(rows, batch.lengths)]))
        return results

    def optim_step(self, model: TrainingModel, adam: Mapping[str, float]) -> dict[str, float]:
        """One AdamW step on the summed gradients (zeros if none were summed), which are then cleared."""
        unknown = sorted(set(adam) - set(ADAM_FIELDS) - {"type"})
        if unknown:
            raise ValueError(f"optim_step params {unknown} are not supported; valid: AdamParams {list(ADAM_FIELDS)}")
        lr = adam.get("learning_rate", 1e-4)
        if not (np.isfinite(lr) and lr >= 0):
            raise ValueError(f"adam_params.learning_rate={lr!r}; valid: a finite number >= 0")
        grads = model.grads if model.grads is not None else jax.tree.map(jnp.zeros_like, model.adapters)
        hyper = {"learning_rate": lr, "b1": adam.get("beta1", 0.9), "b2": adam.get("beta2", 0.95),
                 "eps": adam.get("eps", 1e-12), "weight_decay": adam.get("weight_decay", 0.0),
                 "grad_clip_norm": adam.get("grad_clip_norm", 0.0)}
        hyper = {k: jnp.float32(v) for k, v in hyper.items()}
        model.adapters, model.opt_state, norm = _adam_update(model.adapters, model.opt_state, grads, hyper)
        model.grads, model.steps = None, model.steps + 1
        return {"grad_norm": float(norm)}
