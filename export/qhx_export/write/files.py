"""Writing without half-written results, and without touching what is not ours.

Files go to `<file>.tmp` and are renamed. A bundle goes to `DIR.partial` and is renamed to DIR
when complete. Every bundle carries `.qhx-export.json`, the list of the files the exporter wrote
there; only a directory holding that list (and nothing beyond it) is ever replaced or removed,
so `-o` pointed at a folder of the user's own is refused before any work."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from typing import BinaryIO

from qhx_export import ExportError, __version__

MARKER = ".qhx-export.json"


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


def _tree(top: str) -> tuple[set[str], set[str]]:
    """(files, directories) under `top`, relative, '/'-separated; symlinks count as files."""
    files: set[str] = set()
    dirs: set[str] = set()
    for cur, sub, names in os.walk(top):
        rel = os.path.relpath(cur, top)
        pre = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        for d in list(sub):
            if os.path.islink(os.path.join(cur, d)):
                sub.remove(d)
                files.add(pre + d)
            else:
                dirs.add(pre + d)
        files.update(pre + n for n in names)
    return files, dirs


def _marker(top: str) -> dict | None:
    """The marker at `top` when it is one of ours, else None."""
    try:
        with open(os.path.join(top, MARKER), encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("writer") != "qhx-export":
        return None
    listed = doc.get("files")
    if not isinstance(listed, list) or not all(isinstance(p, str) for p in listed):
        return None
    return doc


def _written(top: str) -> list[str] | None:
    """The files the marker at `top` lists, or None when `top` holds no valid marker."""
    doc = _marker(top)
    return None if doc is None else doc["files"]


def foreign_entries(top: str) -> list[str] | None:
    """What in the directory `top` the exporter did not write: [] for a bundle of ours left as
    written (or an empty directory), the extra entries otherwise; None when it is not a bundle
    of ours at all."""
    files, dirs = _tree(top)
    if not files and not dirs:
        return []
    listed = _written(top)
    if listed is None:
        return None
    ours = set(listed) | {MARKER}
    parents = {p.rsplit("/", 1)[0] for p in ours if "/" in p}
    parents |= {"/".join(p.split("/")[: i + 1]) for p in parents for i in range(p.count("/"))}
    return sorted((files - ours) | (dirs - parents))


def _mark(top: str, complete: bool) -> None:
    files = sorted(_tree(top)[0] - {MARKER}) if complete else []
    doc = {"writer": "qhx-export", "version": __version__, "complete": complete, "files": files}
    with atomic_open(os.path.join(top, MARKER)) as f:
        f.write((json.dumps(doc, indent=1) + "\n").encode())


def check_out(out: str, force: bool) -> None:
    """Refuse (ExportError, nothing touched) unless `out` is absent, empty, or with --force a
    bundle of ours holding nothing else."""
    if os.path.islink(out):
        raise ExportError(f"-o {out}: is a symbolic link; give the directory it points to")
    if not os.path.exists(out):
        return
    if not os.path.isdir(out):
        raise ExportError(f"-o {out}: exists and is not a directory")
    try:
        extra = foreign_entries(out)
    except OSError as e:
        raise ExportError(f"-o {out}: cannot read it ({e.strerror})") from e
    if extra == [] and _written(out) is None:
        return  # an empty directory
    if extra is None:
        raise ExportError(
            f"-o {out}: not empty and not a bundle of qhx-export (no {MARKER}); "
            "nothing was touched: give a new or empty directory"
        )
    if extra:
        more = f" and {len(extra) - 1} more" if len(extra) > 1 else ""
        raise ExportError(
            f"-o {out}: a previous bundle, but {extra[0]!r}{more} in it was not written by "
            "qhx-export; nothing was touched: move it out first"
        )
    if not force:
        raise ExportError(f"-o {out}: holds a previous bundle; --force replaces it")


def _clear_own(path: str, what: str) -> None:
    """Remove `path` if it is a leftover of ours (a marked directory with nothing foreign);
    refuse if anything else sits there."""
    if not os.path.lexists(path):
        return
    if os.path.isdir(path) and not os.path.islink(path):
        doc = _marker(path)
        # an unfinished work directory of ours (its marker is written before anything else),
        # or a finished bundle of ours with nothing added
        if (doc is not None and doc.get("complete") is False) or foreign_entries(path) == []:
            shutil.rmtree(path)
            return
    raise ExportError(f"{path}: exists and was not written by qhx-export ({what}); move it away")


@contextlib.contextmanager
def staged_dir(out: str, force: bool = False) -> Iterator[str]:
    """Yield `out.partial` (fresh) to write into; on success replace `out` with it, on any
    failure (Ctrl-C included) remove it and leave an existing `out` untouched. `out` must be
    absent, an empty directory or, with `force`, a previous bundle of ours (checked before the
    work and again before the swap, so a file put there meanwhile is never lost)."""
    out = os.path.normpath(out)
    partial = out + ".partial"
    check_out(out, force)
    try:
        _clear_own(partial, "the work directory of an export to " + out)
        os.makedirs(partial)
        _mark(partial, complete=False)
    except OSError as e:
        raise ExportError(f"-o {out}: cannot create {partial} ({e.strerror})") from e
    try:
        yield partial
        _mark(partial, complete=True)
        check_out(out, force)
        if os.path.isdir(out):
            old = out + ".old"
            _clear_own(old, "the previous bundle of " + out + " being replaced")
            os.replace(out, old)
            os.replace(partial, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
