"""The stage cache: every finished stage of an HTP export (float graphs, calibration ranges, QDQ
graphs, compiled context binaries, cost-model estimates) is kept under a key made of what it was
made from, so a rerun after a failure (a compile error, Ctrl-C, a full disk, out of memory)
resumes after the last finished stage, and an export for another arch reuses the graphs.

A key hashes: the stage name, the input checkpoint's content (sha256, memoized by path, size and
mtime), the stage's own options, the hashes of the stages it consumed, this package's source code
and the versions of onnx / onnxruntime / onnxruntime-qnn. Changing any of them misses; nothing is
ever reused across a code change.

Layout: `ROOT/<stage>/<key>/` holds the stage's files, `ROOT/<stage>/<key>.partial-<pid>/` one
being written (renamed into place when complete, so a key directory is always whole). Entries are
touched when used; after an export the least recently used ones are removed until the cache is
under its size limit.

Why not joblib.Memory or diskcache: both hold values (pickled or in SQLite), and they would hash
or copy the multi-GB arrays; what a stage leaves is files ORT and QNN must open by path.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from qhx_export import ExportError

DEFAULT_MAX_BYTES = 20 << 30  # QHX_EXPORT_CACHE_MAX_GB overrides
PARTIAL_STALE_S = 24 * 3600  # a .partial older than this is a killed run's


def default_root() -> str | None:
    """$QHX_EXPORT_CACHE (`off`: no cache), else ~/.cache/qhx-export."""
    env = os.environ.get("QHX_EXPORT_CACHE")
    if env == "off":
        return None
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "qhx-export")


def max_bytes() -> int:
    env = os.environ.get("QHX_EXPORT_CACHE_MAX_GB")
    if not env:
        return DEFAULT_MAX_BYTES
    try:
        gb = float(env)
    except ValueError:
        raise ExportError(f"QHX_EXPORT_CACHE_MAX_GB={env!r}: expected a number of GiB") from None
    if gb < 0:
        raise ExportError(f"QHX_EXPORT_CACHE_MAX_GB={env!r}: must not be negative")
    return int(gb * (1 << 30))


_code: list[str] = []


def code_fingerprint() -> str:
    """sha256 over this package's Python sources and the libraries that shape a stage's output."""
    if _code:
        return _code[0]
    from importlib import metadata

    h = hashlib.sha256()
    pkg = os.path.dirname(os.path.abspath(__file__))
    for d, dirs, files in sorted(os.walk(pkg)):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(".py"):
                p = os.path.join(d, f)
                h.update(os.path.relpath(p, pkg).encode() + b"\0")
                with open(p, "rb") as fh:
                    h.update(hashlib.sha256(fh.read()).digest())
    for dist in ("onnx", "onnxruntime", "onnxruntime-qnn", "numpy"):
        try:
            h.update(f"{dist}={metadata.version(dist)}\0".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist}=-\0".encode())
    _code.append(h.hexdigest())
    return _code[0]


def key_of(stage: str, parts: dict[str, Any]) -> str:
    blob = json.dumps({"stage": stage, "code": code_fingerprint(), **parts}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


@dataclass
class StageCache:
    """`root` None: no cache (stages are written to a scratch directory and never found again)."""

    root: str | None
    scratch: str
    log: Callable[[str], None]
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)

    @property
    def enabled(self) -> bool:
        return self.root is not None

    def _base(self) -> str:
        return self.root if self.root is not None else os.path.join(self.scratch, "stages")

    def _count(self, stage: str, hit: bool) -> None:
        s = self.stats.setdefault(stage, {"hit": 0, "miss": 0})
        s["hit" if hit else "miss"] += 1

    def lookup(self, stage: str, key: str) -> str | None:
        """The finished entry's directory, or None."""
        d = os.path.join(self._base(), stage, key)
        if self.enabled and os.path.isfile(os.path.join(d, ".done")):
            with contextlib.suppress(OSError):
                os.utime(d)
            self.used.add(d)
            self._count(stage, True)
            return d
        return None

    @contextlib.contextmanager
    def make(self, stage: str, key: str) -> Iterator[str]:
        """A fresh directory to write the stage into; renamed to the entry when the block ends
        without an exception, removed otherwise."""
        base = os.path.join(self._base(), stage)
        final = os.path.join(base, key)
        tmp = f"{final}.partial-{os.getpid()}"
        try:
            os.makedirs(base, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
        except OSError as e:
            raise ExportError(f"stage cache {base}: cannot create an entry ({e.strerror})") from e
        try:
            yield tmp
            with open(os.path.join(tmp, ".done"), "w") as f:
                f.write(f"{stage} {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
            shutil.rmtree(final, ignore_errors=True)  # an unfinished one of a killed run
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.used.add(final)
        self._count(stage, False)

    def entry(self, stage: str, key: str, build: Callable[[str], None]) -> tuple[str, bool]:
        """(the entry's directory, whether it was found): found, or made by `build(dir)`. Paths
        inside an entry keep their names, so a graph's external data file still sits next to it."""
        found = self.lookup(stage, key)
        if found is not None:
            return found, True
        with self.make(stage, key) as tmp:
            build(tmp)
        return os.path.join(self._base(), stage, key), False

    def summary(self) -> dict[str, Any]:
        return {"dir": self.root, "stages": self.stats} if self.enabled else {"dir": None}

    def prune(self, limit: int | None = None) -> int:
        """Remove least recently used entries (never this run's) until the cache is under `limit`
        bytes, and stale partial entries; returns the bytes removed."""
        if self.root is None or not os.path.isdir(self.root):
            return 0
        limit = max_bytes() if limit is None else limit
        now = time.time()
        entries: list[tuple[float, int, str]] = []
        removed = 0
        for stage in os.listdir(self.root):
            sd = os.path.join(self.root, stage)
            if not os.path.isdir(sd):
                continue
            for name in os.listdir(sd):
                d = os.path.join(sd, name)
                try:
                    mtime = os.stat(d).st_mtime
                except OSError:
                    continue
                size = tree_bytes(d)
                if ".partial-" in name:
                    if now - mtime > PARTIAL_STALE_S:
                        shutil.rmtree(d, ignore_errors=True)
                        removed += size
                    continue
                entries.append((mtime, size, d))
        total = sum(s for _, s, _ in entries)
        for _, size, d in sorted(entries):
            if total <= limit:
                break
            if d in self.used:
                continue
            shutil.rmtree(d, ignore_errors=True)
            total -= size
            removed += size
        if removed:
            self.log(f"stage cache: removed {removed / 1e6:.0f} MB of older entries ({self.root})")
        return removed


def tree_bytes(d: str) -> int:
    n = 0
    for base, _, files in os.walk(d):
        for f in files:
            with contextlib.suppress(OSError):
                n += os.path.getsize(os.path.join(base, f))
    return n


def source_hash(path: str, cache_root: str | None) -> str:
    """sha256 of a checkpoint: the file's (as sha256sum prints it), or over a directory's files
    (names and contents). Memoized in the cache by (path, size, mtime): a 3 GB input is hashed
    once."""
    path = os.path.abspath(path)
    files = (
        [path]
        if os.path.isfile(path)
        else sorted(os.path.join(b, f) for b, _, fs in os.walk(path) for f in fs if not f.startswith("."))
    )
    stamp = [(os.path.relpath(f, path), os.path.getsize(f), os.stat(f).st_mtime_ns) for f in files]
    memo_key = hashlib.sha256(json.dumps([path, stamp]).encode()).hexdigest()
    memo = os.path.join(cache_root, "sources", memo_key) if cache_root else None
    if memo and os.path.isfile(memo):
        with open(memo) as f:
            return f.read().strip()
    h = hashlib.sha256()
    for f, (rel, _, _) in zip(files, stamp, strict=True):
        if f != path:
            h.update(rel.encode() + b"\0")
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
        if f != path:
            h.update(b"\0")
    digest = h.hexdigest()
    if memo:
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(memo), exist_ok=True)
            with open(memo + ".tmp", "w") as f:
                f.write(digest)
            os.replace(memo + ".tmp", memo)
    return digest
