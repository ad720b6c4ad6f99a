"""Read and write the safetensors format with numpy, zero-copy where possible.

Format (https://github.com/huggingface/safetensors): an 8-byte little-endian
header length N, N bytes of JSON ``{name: {"dtype", "shape", "data_offsets":
[begin, end]}, "__metadata__": {...}}``, then the raw little-endian data, with
offsets relative to the end of the header.

Our own reader instead of ``safetensors.numpy`` because (1) it memory-maps the
file, so a sharded load reads only the slices each device needs, (2) it
handles bfloat16 (numpy has no bf16; ml_dtypes provides it), and (3) it
validates offsets against the file size so a truncated file fails naming the
tensor, not with a segfault or garbage. The writer streams each array's buffer
straight to the file (no ``tobytes`` copy).
"""
from __future__ import annotations

import collections
import concurrent.futures
import json
import mmap
import os
import struct
from typing import Any, Iterable, Mapping, Sequence

import ml_dtypes
import numpy as np

from jaxrl_llm.bridge.errors import CheckpointError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn), "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype(np.int64), "I32": np.dtype(np.int32), "I16": np.dtype(np.int16), "I8": np.dtype(np.int8),
    "U64": np.dtype(np.uint64), "U32": np.dtype(np.uint32), "U16": np.dtype(np.uint16), "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_DTYPE_CODES = {dtype: code for code, dtype in _DTYPES.items()}
# A header larger than this is corruption, not a model (the reference implementation uses 100 MB).
_MAX_HEADER_BYTES = 100_000_000


def dtype_code(dtype) -> str:
    """safetensors dtype code ('F32', 'BF16', ...) of a numpy dtype."""
    dtype = np.dtype(dtype)
    if dtype not in _DTYPE_CODES:
        raise CheckpointError(f"dtype {dtype} cannot be stored in safetensors; valid: {sorted(map(str, _DTYPE_CODES))}")
    return _DTYPE_CODES[dtype]


class SafetensorsFile:
    """One memory-mapped ``.safetensors`` file; ``array(name)`` is a read-only zero-copy view."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        size = os.path.getsize(self.path)
        if size < 8:
            raise CheckpointError(f"{self.path}: truncated safetensors file ({size} bytes, the header length alone is 8)")
        with open(self.path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            if header_len > min(_MAX_HEADER_BYTES, size - 8):
                raise CheckpointError(
                    f"{self.path}: header length {header_len} exceeds the file size {size}; file truncated or not safetensors")
            header_bytes = f.read(header_len)
        try:
            header = json.loads(header_bytes)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CheckpointError(f"{self.path}: header is not valid JSON ({err}); file corrupted or not safetensors") from err
        if not isinstance(header, dict):
            raise CheckpointError(f"{self.path}: header must be a JSON object, got {type(header).__name__}")
        self.metadata = header.pop("__metadata__", None) or {}
        self._data_start = 8 + header_len
        self._specs = {name: self._parse_spec(name, info, size) for name, info in header.items()}
        # np.memmap refuses empty files; a header-only file holds only empty tensors.
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r") if size > self._data_start else None

    def _parse_spec(self, name: str, info, file_size: int) -> tuple[np.dtype, tuple[int, ...], int, int]:
        try:
            code, shape, (begin, end) = info["dtype"], tuple(int(d) for d in info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"{self.path}: tensor {name!r} has a malformed header entry {info!r}") from err
        if code not in _DTYPES:
            raise CheckpointError(f"{self.path}: tensor {name!r} has unknown dtype {code!r}; valid: {sorted(_DTYPES)}")
        dtype = _DTYPES[code]
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if end - begin != expected or begin < 0:
            raise CheckpointError(
                f"{self.path}: tensor {name!r} ({code}{list(shape)}) has data_offsets [{begin}, {end}] "
                f"spanning {end - begin} bytes; its shape needs {expected}")
        if self._data_start + end > file_size:
            raise CheckpointError(
                f"{self.path}: tensor {name!r} ends at byte {self._data_start + end} but the file has {file_size} bytes; "
                "the file is truncated")
        return dtype, shape, begin, end

    @property
    def names(self) -> list[str]:
        return list(self._specs)

    def dtype(self, name: str) -> np.dtype:
        return self._spec(name)[0]

    def shape(self, name: str) -> tuple[int, ...]:
        return self._spec(name)[1]

    def array(self, name: str) -> np.ndarray:
        """Zero-copy read-only view; slicing it reads only the touched pages from disk."""
        dtype, shape, begin, end = self._spec(name)
        if begin == end:  # an empty tensor has no bytes to map
            empty = np.zeros(shape, dtype)
            empty.flags.writeable = False
            return empty
        start = self._data_start + begin
        return self._map[start:self._data_start + end].view(dtype).reshape(shape)

    def _spec(self, name: str):
        if name not in self._specs:
            raise CheckpointError(f"{self.path}: no tensor named {name!r}")
        return self._specs[name]


class SafetensorsDir:
    """The tensors of an HF checkpoint directory: ``model.safetensors``, or shards listed
    by ``model.safetensors.index.json`` (``{"weight_map": {tensor: shard_file}}``)."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = os.fspath(directory)
        index_path = os.path.join(self.directory, INDEX_FILE)
        single_path = os.path.join(self.directory, SINGLE_FILE)
        if os.path.exists(index_path):
            self._files, self._file_of = self._open_index(index_path)
        elif os.path.exists(single_path):
            single = SafetensorsFile(single_path)
            self._files = {SINGLE_FILE: single}
            self._file_of = {name: SINGLE_FILE for name in single.names}
        else:
            raise CheckpointError(f"{self.directory}: holds neither {SINGLE_FILE} nor {INDEX_FILE}")

    def _open_index(self, index_path: str):
        try:
            with open(index_path, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise CheckpointError(f"{index_path}: not a valid safetensors index (needs a 'weight_map' object): {err}") from err
        files = {}
        for shard in sorted(set(weight_map.values())):
            shard_path = os.path.join(self.directory, shard)
            if not os.path.exists(shard_path):
                tensors = sorted(n for n, s in weight_map.items() if s == shard)
                raise CheckpointError(f"{index_path}: shard {shard!r} (holding e.g. {tensors[:3]}) does not exist")
            files[shard] = SafetensorsFile(shard_path)
        for name, shard in weight_map.items():
            if name not in files[shard].names:
                raise CheckpointError(f"{index_path}: tensor {name!r} is mapped to {shard!r}, which does not contain it")
        return files, dict(weight_map)

    @property
    def names(self) -> list[str]:
        return list(self._file_of)

    def file(self, name: str) -> SafetensorsFile:
        if name not in self._file_of:
            raise CheckpointError(f"{self.directory}: no tensor named {name!r}")
        return self._files[self._file_of[name]]

    def array(self, name: str) -> np.ndarray:
        return self.file(name).array(name)


def write_safetensors(path: str | os.PathLike, tensors: Mapping[str, np.ndarray],
                      metadata: Mapping[str, str] | None = None, *, fsync: bool = True) -> int:
    """Write ``tensors`` (C-contiguous numpy arrays, in the mapping's order); returns the bytes written."""
    specs = [(name, array.dtype, array.shape) for name, array in tensors.items()]
    return write_safetensors_stream(path, specs, tensors.values(), metadata, fsync=fsync)


def _header(specs: Sequence[tuple[str, Any, Sequence[int]]],
            metadata: Mapping[str, str] | None) -> tuple[bytes, int]:
    """(the JSON header padded to 8 bytes, the data size) of tensors laid out in `specs` order.
    ``__metadata__`` always carries ``format: pt``, which transformers requires."""
    header, offset = {}, 0
    for name, dtype, shape in specs:
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        header[name] = {"dtype": dtype_code(dtype), "shape": [int(d) for d in shape],
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt", **(metadata or {})}
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    return header_bytes + b" " * (-len(header_bytes) % 8), offset  # keep the data 8-byte aligned


def write_safetensors_stream(path: str | os.PathLike, specs: Sequence[tuple[str, Any, Sequence[int]]],
                             arrays: Iterable[np.ndarray], metadata: Mapping[str, str] | None = None, *,
                             fsync: bool = True) -> int:
    """Write tensors whose (name, dtype, shape) are known up front, while ``arrays`` yields them in order.

    Streaming lets a caller produce (e.g. transpose on device) one tensor while the
    previous one is written, holding only a few in host memory. Each array must be
    C-contiguous and match its spec. ``__metadata__`` always carries ``format: pt``,
    which transformers requires. Returns the bytes written.
    """
    header_bytes, offset = _header(specs, metadata)
    written = 0
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for (name, dtype, shape), array in zip(specs, arrays, strict=True):
            if array.dtype != np.dtype(dtype) or tuple(array.shape) != tuple(shape):
                raise ValueError(f"tensor {name!r} is {array.dtype}{list(array.shape)}, "
                                 f"but its spec says {np.dtype(dtype)}{list(shape)}")
            if not array.flags.c_contiguous:
                raise ValueError(f"tensor {name!r} is not C-contiguous; pass np.ascontiguousarray(...) explicitly")
            if array.nbytes:  # the raw buffer, no tobytes() copy
                f.write(memoryview(array.reshape(-1).view(np.uint8)))
            written += array.nbytes
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    return 8 + len(header_bytes) + written


_SAME_SIZE_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _copy_bits(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[...] = src as raw bits (same item size): a plain integer copy, which numpy runs
    without the GIL, also for dtypes such as bfloat16 whose own copy loop is slower."""
    uint = _SAME_SIZE_UINT[src.dtype.itemsize]
    np.copyto(dst.view(uint), src.view(uint), casting="no")


def write_safetensors_in_place(path: str | os.PathLike, specs: Sequence[tuple[str, Any, Sequence[int]]],
                               arrays: Iterable[np.ndarray], metadata: Mapping[str, str] | None = None, *,
                               workers: int = 2) -> int:
    """``write_safetensors_stream`` for a staging copy that is rewritten every step: an existing
    file at ``path`` is overwritten in place (not truncated to zero first), through a shared
    writable memory map of the whole file, by ``workers`` threads while ``arrays`` yields the
    next tensors.

    ``arrays`` may be strided views, e.g. ``x.swapaxes(-1, -2)`` of a host array: the copy into
    the mapped file lays each out in C order, so a transpose costs no pass of its own. On a RAM
    filesystem (/dev/shm) a new file costs a page allocation and zeroing per 4 KiB; rewriting
    the pages of the previous copy skips both, and MAP_POPULATE maps them in one call instead
    of one page fault each. numpy's copy releases the GIL, so the writers run beside the
    producer of ``arrays``. No fsync. Returns the bytes written.
    """
    header_bytes, size = _header(specs, metadata)
    data_start = 8 + len(header_bytes)
    fd = os.open(os.fspath(path), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, data_start + size)  # same size as the previous copy: keeps its pages
        head = memoryview(struct.pack("<Q", len(header_bytes)) + header_bytes)
        while head.nbytes:  # pwrite may write less than asked
            head = head[os.pwrite(fd, head, data_start - head.nbytes):]
        if size == 0:
            return data_start
        mapped = mmap.mmap(fd, data_start + size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                           prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)  # the mapping keeps the file open
    try:
        _copy_into(np.frombuffer(mapped, np.uint8), data_start, specs, arrays, workers)
    finally:
        try:
            mapped.close()
        except BufferError:  # a failed copy's traceback still holds a view: unmapped when it is freed
            pass
    return data_start + size


def _copy_into(file_bytes: np.ndarray, begin: int, specs, arrays, workers: int) -> None:
    """Copy each array into its slot of the mapped file, tensors in `specs` order from ``begin``."""
    pending: collections.deque = collections.deque()
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="safetensors-write") as pool:
        for (name, dtype, shape), array in zip(specs, arrays, strict=True):
            if array.dtype != np.dtype(dtype) or tuple(array.shape) != tuple(shape):
                raise ValueError(f"tensor {name!r} is {array.dtype}{list(array.shape)}, "
                                 f"but its spec says {np.dtype(dtype)}{list(shape)}")
            slot = file_bytes[begin:begin + array.nbytes].view(array.dtype).reshape(array.shape)
            pending.append(pool.submit(_copy_bits, slot, array))
            begin += array.nbytes  # the spec's size: checked above
            while len(pending) > 2 * workers:  # bounds the host arrays held alive
                pending.popleft().result()
        while pending:
            pending.popleft().result()
