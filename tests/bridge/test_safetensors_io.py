"""Our safetensors reader/writer against the reference `safetensors` library."""
from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy

from jaxrl_llm.bridge import CheckpointError, SafetensorsFile, write_safetensors

torch = pytest.importorskip("torch")


def _arrays():
    rng = np.random.default_rng(0)
    return {
        "f32": rng.normal(size=(3, 5)).astype(np.float32),
        "bf16": rng.normal(size=(7,)).astype(ml_dtypes.bfloat16),
        "f16": rng.normal(size=(2, 2, 3)).astype(np.float16),
        "i64": np.arange(6, dtype=np.int64).reshape(2, 3),
        "empty": np.zeros((0, 4), np.float32),
    }


def test_reference_library_reads_what_we_write(tmp_path):
    path = tmp_path / "ours.safetensors"
    arrays = _arrays()
    size = write_safetensors(path, arrays, metadata={"note": "x"})
    assert size == os.path.getsize(path)
    assert (int.from_bytes(path.read_bytes()[:8], "little") + 8) % 8 == 0  # data section 8-byte aligned
    with safetensors.safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": "pt", "note": "x"}
        assert sorted(f.keys()) == sorted(arrays)
        for name, array in arrays.items():
            got = f.get_tensor(name)
            expected = torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16) if name == "bf16" \
                else torch.from_numpy(array)
            assert got.dtype == expected.dtype and torch.equal(got, expected), name


def test_we_read_what_the_reference_library_writes(tmp_path):
    path = tmp_path / "theirs.safetensors"
    arrays = {k: v for k, v in _arrays().items() if k != "bf16"}  # safetensors.numpy has no bfloat16
    safetensors.numpy.save_file(arrays, str(path))
    ours = SafetensorsFile(path)
    assert sorted(ours.names) == sorted(arrays)
    for name, array in arrays.items():
        view = ours.array(name)
        assert view.dtype == array.dtype and not view.flags.writeable
        np.testing.assert_array_equal(view, array)


def test_arrays_are_memory_mapped_views(tmp_path):
    path = tmp_path / "m.safetensors"
    write_safetensors(path, {"w": np.arange(1 << 16, dtype=np.float32)})
    view = SafetensorsFile(path).array("w")
    assert isinstance(view.base, np.memmap) or isinstance(getattr(view.base, "base", None), np.memmap)
    assert not view.flags.owndata


def test_writer_rejects_non_contiguous(tmp_path):
    with pytest.raises(ValueError, match="'t' is not C-contiguous"):
        write_safetensors(tmp_path / "x.safetensors", {"t": np.zeros((3, 4), np.float32).T})


def test_tiny_truncated_file(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"\x01\x02")
    with pytest.raises(CheckpointError, match=r"truncated safetensors file \(2 bytes"):
        SafetensorsFile(path)
