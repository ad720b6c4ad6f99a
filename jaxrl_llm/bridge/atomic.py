"""Publish a directory atomically: readers see the old checkpoint or the new one, never half of one.

Recipe: fill a temporary directory next to the target (same filesystem, so a
rename is atomic), fsync every file and the directory, then rename it onto
the target and fsync the parent so the rename itself survives a crash. An
existing target is swapped with ``renameat2(RENAME_EXCHANGE)`` (Linux >= 3.15,
one atomic step); where that is unavailable the old one is first renamed
aside, leaving a moment in which the target is absent (but never partial).
"""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import tempfile
from typing import Callable

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _load_renameat2():
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return function


_renameat2 = _load_renameat2()


def fsync_path(path: str) -> None:
    """fsync a file or a directory by path (a directory fsync persists its entries)."""
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if os.path.isdir(path) else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def exchange_paths(a: str, b: str) -> bool:
    """Atomically swap two existing paths; False where the kernel/filesystem cannot."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, f"renameat2(RENAME_EXCHANGE) {a!r} <-> {b!r}: {os.strerror(code)}")


def write_directory_atomically(target: str | os.PathLike, fill: Callable[[str], None], *, fsync: bool = True) -> str:
    """Call ``fill(tmp_dir)`` to write the files, then publish ``tmp_dir`` as ``target``.

    ``fill`` should not fsync itself when ``fsync`` is True: every regular file in
    the directory is fsynced here. On any error the temporary directory is removed
    and an existing target is left untouched. Returns the absolute target path.
    """
    target = os.path.abspath(os.fspath(target))
    parent, name = os.path.split(target)
    if os.path.exists(target) and not os.path.isdir(target):
        raise FileExistsError(f"{target} exists and is not a directory; refusing to replace it")
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    try:
        fill(staging)
        os.chmod(staging, 0o755)  # mkdtemp makes it 0700; a checkpoint is meant to be read by others
        if fsync:
            for entry in os.scandir(staging):
                if entry.is_file(follow_symlinks=False):
                    fsync_path(entry.path)
            fsync_path(staging)
        _publish(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if fsync:
        fsync_path(parent)
    return target


def _publish(staging: str, target: str) -> None:
    """Move the finished ``staging`` onto ``target``, swapping out an existing one."""
    try:
        os.rename(staging, target)  # atomic when target is absent (or an empty directory)
        return
    except OSError as err:
        if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    if exchange_paths(staging, target):  # staging now holds the old checkpoint
        shutil.rmtree(staging, ignore_errors=True)
        return
    aside = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old-", dir=os.path.dirname(target))
    os.rename(target, os.path.join(aside, "old"))
    os.rename(staging, target)
    shutil.rmtree(aside, ignore_errors=True)
