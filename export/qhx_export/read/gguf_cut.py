"""Where a cut or corrupt GGUF file goes wrong, in words a user can act on.

`gguf.GGUFReader` fails on a cut file with whatever numpy or struct says at the point it stops
("When changing to a larger dtype, its size must be a divisor ..."). This walks the header and
tensor directory itself (GGUF v2/v3: little-endian counts of 64 bits, key/value pairs, then
name, dims, type and offset per tensor, data aligned to `general.alignment`, default 32) to say
which part is cut, where, and how big the file should be."""

from __future__ import annotations

import os
import struct
from typing import BinaryIO

from qhx_export.dequant import nbytes, supported, type_name

# scalar GGUF value types: id -> struct format
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class _Short(Exception):
    def __init__(self, what: str, at: int) -> None:
        super().__init__(what)
        self.what, self.at = what, at


class _Bad(Exception):
    pass


class _Cursor:
    def __init__(self, f: BinaryIO) -> None:
        self.f = f

    def take(self, n: int, what: str) -> bytes:
        at = self.f.tell()
        b = self.f.read(n)
        if len(b) < n:
            raise _Short(what, at)
        return b

    def unpack(self, fmt: str, what: str) -> tuple:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what))

    def string(self, what: str) -> str:
        (n,) = self.unpack("Q", what)
        if n > 1 << 30:
            raise _Bad(f"{what} claims a string of {n} bytes")
        return self.take(n, what).decode("utf-8", errors="replace")

    def value(self, vtype: int, what: str) -> object:
        if vtype in _SCALAR:
            return self.unpack(_SCALAR[vtype], what)[0]
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            itype, count = self.unpack("IQ", what)
            if count > 1 << 32:
                raise _Bad(f"{what} claims an array of {count} values")
            if itype in _SCALAR:  # skipped, not decoded: a vocabulary has 10^5 of them
                self.take(struct.calcsize("<" + _SCALAR[itype]) * count, what)
                return None
            for _ in range(count):
                self.value(itype, what)
            return None
        raise _Bad(f"{what} has unknown value type {vtype}")


def diagnose(path: str) -> str | None:
    """One line on what in `path` is cut short or corrupt (without the path), or None when
    the header and every tensor's bytes are all there."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        c = _Cursor(f)
        try:
            magic, version = c.unpack("4sI", "the header")
            if magic != b"GGUF" or version not in (2, 3):
                return f"not a GGUF v2/v3 file (magic {magic!r}, version {version})"
            n_tensors, n_kv = c.unpack("QQ", "the header")
            if n_tensors > 1 << 24 or n_kv > 1 << 24:
                return f"corrupt header ({n_tensors} tensors, {n_kv} metadata keys)"
            align = 32
            for i in range(n_kv):
                key = c.string(f"metadata key {i + 1} of {n_kv}")
                (vtype,) = c.unpack("I", f"metadata {key}")
                v = c.value(vtype, f"metadata {key}")
                if key == "general.alignment" and isinstance(v, int) and v > 0:
                    align = v
            infos = []
            for i in range(n_tensors):
                name = c.string(f"the directory entry of tensor {i + 1} of {n_tensors}")
                (nd,) = c.unpack("I", f"the directory entry of tensor {name}")
                if nd > 8:
                    return f"corrupt directory entry of tensor {name} ({nd} dims)"
                dims = c.unpack("Q" * nd, f"the directory entry of tensor {name}")
                qt, off = c.unpack("IQ", f"the directory entry of tensor {name}")
                infos.append((name, dims, qt, off))
        except _Short as e:
            return (
                f"truncated at {size} bytes, inside {e.what} (a read from byte {e.at}); "
                "the file was cut short, download or copy it again"
            )
        except _Bad as e:
            return f"corrupt: {e}"
        start = -(-f.tell() // align) * align
    end_of = []
    for name, dims, qt, off in infos:
        if not supported(qt):
            return None  # the reader names unsupported types itself
        end_of.append((start + off + nbytes(qt, list(dims)), start + off, name, qt))
    whole = max((e for e, *_ in end_of), default=start)
    for end, first, name, qt in sorted(end_of, key=lambda t: t[1]):
        if end > size:
            return (
                f"truncated at {size} bytes: tensor {name} ({type_name(qt)}, bytes {first}..{end}) "
                f"is cut short; the whole file is {whole} bytes, download or copy it again"
            )
    return None
