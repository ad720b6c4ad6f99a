"""Where a step's sequences sit in the learner's rows: packed, or one per row.

The learner runs a step batch as k micro-batches of R rows x W slots. A `RowPlan` says which
slots hold which sequence's tokens, and how to read every completion token's log-prob back
into the step batch's [N, T_c] layout, so the loss and every metric are computed on exactly the
arrays they would be without packing: the aggregation weights are fixed on the whole step
batch (`core.prepare_step_batch`), a micro-batch's loss is a plain weighted sum over its
sequences, and packing changes neither the weights nor the sums.

* ``pack=True``: sequences go first-fit-decreasing into rows of W slots (Johnson 1973;
  the layout of Krell et al. 2021, "Efficient Sequence Packing without Cross-contamination",
  arXiv 2107.02027): each row holds sequences back to back from slot 0, with segment ids
  1, 2, ... (0 = padding) and positions restarting at 0 in each; the model never lets a
  token attend across a segment boundary (`models.forward(segment_ids=...)`).
* ``pack=False``: each sequence alone in its row, from slot 0 (the same mechanism, one
  segment per row).

Every row also holds at most T_c completion tokens, so a micro-batch's LM head runs on R x T_c
gathered positions in both modes: the head and its log-softmax see completion positions only.
Micro-batches take R consecutive rows; the plan always has k = ceil(N / R) micro-batches (what
one sequence per row needs), so the compiled program's shapes do not depend on the lengths;
micro-batches that packing left empty are skipped by the learner (`RowPlan.used`).
A MoE policy's routing records (`SequenceBatch.routing`) move with their tokens slot for slot
(`RowPlan.routing`, -1 in every slot without a record; `train.learn.routing_replay`).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np


class RowPlan(NamedTuple):
    """One step batch laid out for the learner. k micro-batches x R rows x W slots."""

    tokens: np.ndarray  # int32 [k, R, W]
    segment_ids: np.ndarray  # int32 [k, R, W]: 1, 2, ... per sequence in its row, 0 = padding
    positions: np.ndarray  # int32 [k, R, W]: restart at 0 in every segment
    head_slots: np.ndarray  # int32 [k, R * T_c]: flat slot (in R * W) predicting each completion token; 0 = unused
    completion_index: np.ndarray  # int32 [N, T_c]: where completion token (n, j)'s log-prob sits in its micro-batch's R * T_c
    micro_batch: np.ndarray  # int32 [N]: the micro-batch holding sequence n
    used: np.ndarray  # bool [k]: micro-batches holding at least one sequence
    max_segments: int  # most sequences in one row, rounded up to a power of two (a static shape: few programs)
    padding_fraction: float  # share of the used micro-batches' slots holding no token
    routing: np.ndarray | None = None  # int32 [k, R, W, nL, top_k]: the tokens' routing records, -1 where none


def sequence_spans(attention_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of each row's one contiguous run of real tokens."""
    mask = np.asarray(attention_mask) > 0
    lengths = mask.sum(1).astype(np.int64)
    starts = np.where(lengths > 0, mask.argmax(1), 0).astype(np.int64)
    ends = starts + lengths
    for i, (s, e) in enumerate(zip(starts, ends)):
        if not mask[i, s:e].all():
            raise ValueError(f"row {i}'s tokens are not one contiguous run; the learner packs whole sequences")
    return starts, lengths


def first_fit_decreasing(lengths: np.ndarray, completions: np.ndarray, width: int, completion_width: int,
                         *, pack: bool) -> list[list[int]]:
    """Rows as lists of sequence indices: longest first, each into the first row with room for
    its tokens (<= width) and its completion tokens (<= completion_width). Without `pack`, one per row."""
    order = np.argsort(-np.asarray(lengths), kind="stable")
    if not pack:
        return [[int(i)] for i in sorted(order)]
    rows: list[list[int]] = []
    room: list[tuple[int, int]] = []
    for i in order:
        n, c = int(lengths[i]), int(completions[i])
        slot = next((r for r, (free, free_c) in enumerate(room) if free >= n and free_c >= c), None)
        if slot is None:
            rows.append([]), room.append((width, completion_width))
            slot = len(rows) - 1
        rows[slot].append(int(i))
        room[slot] = (room[slot][0] - n, room[slot][1] - c)
    return rows


def rows_per_micro_batch(micro_batch_tokens: int, width: int, multiple: int = 1) -> int:
    """Rows of `width` slots in a micro-batch of `micro_batch_tokens` (at least one), rounded up
    to a multiple of `multiple` (the data-parallel devices each take an equal share)."""
    rows = max(1, micro_batch_tokens // width)
    return -(-rows // multiple) * multiple


def plan_rows(tokens: np.ndarray, attention_mask: np.ndarray, prompt_width: int, *, rows_per_micro: int,
              pack: bool, routing: np.ndarray | None = None) -> RowPlan:
    """The RowPlan of a batch built by `train.batch.build_sequences` (row i: [left padding | prompt |
    completion | right padding], the completion starting at column `prompt_width`). ``routing``
    [N, width, nL, k] (`SequenceBatch.routing`) moves with the tokens, -1 in every other slot."""
    tokens = np.asarray(tokens)
    n, width = tokens.shape
    completion_width = width - prompt_width
    if rows_per_micro < 1:
        raise ValueError(f"rows_per_micro={rows_per_micro} must be >= 1")
    starts, lengths = sequence_spans(attention_mask)
    prompt_lengths = prompt_width - starts
    completions = lengths - prompt_lengths
    if (prompt_lengths < 1).any():
        raise ValueError("every sequence needs at least one prompt token before column prompt_width")
    rows = first_fit_decreasing(lengths, completions, width, completion_width, pack=pack)
    k = math.ceil(n / rows_per_micro)
    shape = (k, rows_per_micro, width)
    out_tokens, segments, positions = (np.zeros(shape, np.int32) for _ in range(3))
    head_slots = np.zeros((k, rows_per_micro * completion_width), np.int32)
    completion_index = np.zeros((n, completion_width), np.int32)
    micro_batch = np.zeros(n, np.int32)
    filled_head = np.zeros(k, np.int64)
    out_routing = None if routing is None else np.full(shape + np.shape(routing)[2:], -1, np.int32)
    max_segments = 1
    for r, members in enumerate(rows):
        m, row = divmod(r, rows_per_micro)
        at = 0
        max_segments = max(max_segments, len(members))
        for segment, i in enumerate(members, start=1):
            length, prompt, c = int(lengths[i]), int(prompt_lengths[i]), int(completions[i])
            out_tokens[m, row, at:at + length] = tokens[i, starts[i]:starts[i] + length]
            if out_routing is not None:
                out_routing[m, row, at:at + length] = routing[i, starts[i]:starts[i] + length]
            segments[m, row, at:at + length] = segment
            positions[m, row, at:at + length] = np.arange(length)
            # completion token j sits at slot at + prompt + j and is predicted from the slot before it
            first = filled_head[m]
            head_slots[m, first:first + c] = row * width + at + prompt - 1 + np.arange(c)
            completion_index[i, :c] = first + np.arange(c)
            micro_batch[i] = m
            filled_head[m] += c
            at += length
    used = np.zeros(k, bool)
    used[micro_batch] = True
    slots = int(used.sum()) * rows_per_micro * width
    padding = 1.0 - float(lengths.sum()) / slots
    return RowPlan(out_tokens, segments, positions, head_slots, completion_index, micro_batch, used,
                   1 << (max_segments - 1).bit_length(), padding, out_routing)
