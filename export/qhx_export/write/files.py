"""Writing without half-written results: files go to `<file>.tmp` and are renamed; a bundle goes
to `DIR.partial` and is renamed to DIR when complete."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from typing import BinaryIO

from qhx_export import ExportError


@contextlib.contextmanager
def atomic_open(path: str) -> Iterator[BinaryIO]:
    """Write `path.tmp`, rename to `path` on success, remove the tmp file on failure."""
    tmp = path + ".tmp"
    f = open(tmp, "wb")  # closed on both paths below
    try:
        yield f
        f.close()
        os.replace(tmp, path)
    except BaseException:
        f.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def staged_dir(out: str) -> Iterator[str]:
    """Yield `out.partial` (fresh) to write into; on success replace `out` with it, on any
    failure (Ctrl-C included) remove it and leave an existing `out` untouched."""
    out = os.path.normpath(out)
    partial = out + ".partial"
    if os.path.exists(out) and not os.path.isdir(out):
        raise ExportError(f"-o {out}: exists and is not a directory")
    try:
        if os.path.isdir(partial):
            shutil.rmtree(partial)
        os.makedirs(partial)
    except OSError as e:
        raise ExportError(f"-o {out}: cannot create {partial} ({e.strerror})") from e
    try:
        yield partial
        if os.path.isdir(out):
            old = out + ".old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
            os.replace(partial, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
