"""The Tinker SDK's wire formats (tinker 0.38), read from its source: `tinker.proto.request_conv`
(what the client sends) and `tinker.proto.response_conv` (what it reads back).

- forward / forward_backward arrive as a protobuf `ForwardBackwardRequest` (Content-Type
  application/x-protobuf; `forward_only` tells them apart). Tokens are int32 bytes, tensors
  dense bytes or CSR (values + int64 row pointers + int64 column indices).
- `ForwardBackwardOutput` and `SampleResponse` go back as protobuf only (0.38 refuses them as
  JSON); every other result is JSON.

Everything here is plain numpy: no JAX, no HTTP.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

_NUMPY_OF = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


class WireError(ValueError):
    """A request the server cannot read (a user error: the message names the bad part)."""


@dataclasses.dataclass(frozen=True)
class Datum:
    """One training example: input tokens [N] and its named per-position inputs, each [N]."""

    tokens: np.ndarray  # int32 [N]
    inputs: Mapping[str, np.ndarray]  # e.g. target_tokens int64 [N], weights / advantages / logprobs float32 [N]


@dataclasses.dataclass(frozen=True)
class ForwardBackwardCall:
    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: Mapping[str, float | str]
    forward_only: bool
    data: tuple[Datum, ...]


def tensor_to_numpy(msg: pb.Tensor, name: str) -> np.ndarray:
    """A proto Tensor as a dense numpy array (CSR densified with zeros)."""
    if msg.dtype not in _NUMPY_OF:
        raise WireError(f"loss_fn_inputs[{name!r}] has dtype {msg.dtype}; valid: float32, int64, int32")
    dtype = _NUMPY_OF[msg.dtype]
    shape = tuple(int(s) for s in msg.shape)
    if msg.HasField("sparse_csr"):
        values = np.frombuffer(msg.sparse_csr.values, dtype)
        crow = np.frombuffer(msg.sparse_csr.crow_indices, np.int64)
        col = np.frombuffer(msg.sparse_csr.col_indices, np.int64)
        if len(shape) != 2 or crow.size != shape[0] + 1 or col.size != values.size:
            raise WireError(f"loss_fn_inputs[{name!r}]: CSR tensor of shape {shape} with {crow.size} row "
                            f"pointers and {col.size} columns for {values.size} values")
        dense = np.zeros(shape, dtype)
        rows = np.repeat(np.arange(shape[0]), np.diff(crow))
        dense[rows, col] = values
        return dense
    array = np.frombuffer(msg.dense, dtype)
    if shape and int(np.prod(shape)) != array.size:
        raise WireError(f"loss_fn_inputs[{name!r}] has {array.size} values for shape {list(shape)}")
    return array.reshape(shape) if shape else array


def _datum(msg: pb.Datum, index: int) -> Datum:
    tokens = []
    for chunk in msg.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise WireError(f"datum {index}: a {kind!r} model_input chunk; valid: encoded_text (token ids) only")
        tokens.append(np.frombuffer(chunk.encoded_text.tokens, np.int32))
    inputs = {name: tensor_to_numpy(t, name) for name, t in msg.loss_fn_inputs.items()}
    return Datum(np.concatenate(tokens) if tokens else np.zeros(0, np.int32), inputs)


def _config(msg: pb.ForwardBackwardRequest) -> dict[str, float | str]:
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():  # v2 wins where both are set (request_conv writes both)
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    return config


def parse_forward_backward(body: bytes) -> ForwardBackwardCall:
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as err:  # protobuf's DecodeError
        raise WireError(f"the body is not a tinker_public.ForwardBackwardRequest ({err})") from err
    data = tuple(_datum(d, i) for i, d in enumerate(msg.data))
    return ForwardBackwardCall(msg.model_id, int(msg.seq_id), msg.loss_fn, _config(msg), bool(msg.forward_only), data)


def _batched(arrays: list[np.ndarray], dtype, proto_dtype) -> pb.BatchedTensor:
    arrays = [np.ascontiguousarray(a, dtype) for a in arrays]
    offsets = np.concatenate([[0], np.cumsum([a.nbytes for a in arrays])]).astype(np.int64)
    return pb.BatchedTensor(data=b"".join(a.tobytes() for a in arrays), offsets=offsets.tobytes(),
                            dtype=proto_dtype)


def forward_backward_output(per_datum: Mapping[str, list[np.ndarray]], metrics: Mapping[str, float],
                            num_datums: int) -> bytes:
    """A `ForwardBackwardOutput` of float32 per-datum [N] arrays by name (e.g. "logprobs")."""
    record = pb.ArrayRecord(type_tag="ArrayRecord", num_datums=num_datums)
    for name, arrays in per_datum.items():
        record.fields[name].CopyFrom(_batched(arrays, np.float32, pb.DTYPE_FLOAT32))
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=[record],
                                   metrics={k: float(v) for k, v in metrics.items()})
    return out.SerializeToString()


@dataclasses.dataclass(frozen=True)
class Sequence:
    tokens: np.ndarray  # int32 [L]
    logprobs: np.ndarray  # float32 [L]
    stop_reason: str  # "stop" | "length"


def sample_response(sequences: list[Sequence], prompt_logprobs: np.ndarray | None) -> bytes:
    """A `SampleResponse`; prompt_logprobs float32 [P] with NaN at position 0, or None."""
    reasons = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}
    out = pb.SampleResponse(sequences=[
        pb.SampledSequence(stop_reason=reasons[s.stop_reason], tokens=np.asarray(s.tokens, np.int32).tobytes(),
                           logprobs=np.asarray(s.logprobs, np.float32).tobytes()) for s in sequences])
    if prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray(prompt_logprobs, np.float32).tobytes()
    return out.SerializeToString()
