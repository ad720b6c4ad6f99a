"""Atomic directory publication: readers see a whole old or a whole new checkpoint."""
from __future__ import annotations

import os
import threading

import pytest

from jaxrl_llm.bridge import atomic, write_directory_atomically

PAYLOAD = 1 << 20  # 1 MiB per file, so a partially written file would be visible


def _fill(version: int):
    def fill(directory):
        for name in ("a.bin", "b.bin"):
            with open(os.path.join(directory, name), "wb") as f:
                f.write(bytes([version % 256]) * PAYLOAD)
    return fill


def _read(target) -> tuple[bytes, bytes]:
    """Both files through ONE directory handle: what a reader that opened the checkpoint sees."""
    dir_fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    try:
        contents = []
        for name in ("a.bin", "b.bin"):
            fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
            with os.fdopen(fd, "rb") as f:
                contents.append(f.read())
        return contents[0], contents[1]
    finally:
        os.close(dir_fd)


def test_publish_new_and_replace_existing(tmp_path):
    target = tmp_path / "ckpt"
    assert write_directory_atomically(target, _fill(1)) == str(target)
    assert _read(target) == (b"\x01" * PAYLOAD,) * 2
    write_directory_atomically(target, _fill(2))
    assert _read(target) == (b"\x02" * PAYLOAD,) * 2
    assert os.listdir(tmp_path) == ["ckpt"]  # no staging or old copies left behind
    assert oct(os.stat(target).st_mode & 0o777) == oct(0o755)


def test_failed_write_keeps_the_old_checkpoint(tmp_path):
    target = tmp_path / "ckpt"
    write_directory_atomically(target, _fill(1))

    def crash(directory):
        _fill(9)(directory)
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_directory_atomically(target, crash)
    assert _read(target) == (b"\x01" * PAYLOAD,) * 2
    assert os.listdir(tmp_path) == ["ckpt"]


def test_refuses_to_replace_a_file(tmp_path):
    (tmp_path / "ckpt").write_text("not a dir")
    with pytest.raises(FileExistsError, match="not a directory"):
        write_directory_atomically(tmp_path / "ckpt", _fill(1))


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "rename-aside-fallback"])
def test_concurrent_reader_never_sees_a_mixed_or_partial_checkpoint(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(atomic, "exchange_paths", lambda a, b: False)
    target = tmp_path / "ckpt"
    write_directory_atomically(target, _fill(0))
    stop, seen, problems = threading.Event(), set(), []

    def reader():
        while not stop.is_set():
            try:
                a, b = _read(target)
            except FileNotFoundError:
                # The fallback leaves the path briefly absent, and a swapped-out old directory is
                # deleted under a slow reader; both are "no checkpoint", never a wrong one.
                continue
            if a != b or len(a) != PAYLOAD or len(set(a)) != 1:
                problems.append((len(a), len(b)))
            seen.add(a[0])

    thread = threading.Thread(target=reader)
    thread.start()
    for version in range(1, 15):
        write_directory_atomically(target, _fill(version), fsync=False)
    stop.set()
    thread.join()
    assert not problems
    assert len(seen) >= 2  # the reader did observe several versions
    assert _read(target) == (bytes([14]) * PAYLOAD,) * 2


def test_exchange_paths_swaps(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    (tmp_path / "x" / "from_x").touch()
    if not atomic.exchange_paths(str(tmp_path / "x"), str(tmp_path / "y")):
        pytest.skip("renameat2(RENAME_EXCHANGE) unsupported on this filesystem")
    assert os.listdir(tmp_path / "y") == ["from_x"] and os.listdir(tmp_path / "x") == []
