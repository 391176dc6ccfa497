"""GGUF reader: metadata and tensor directory through `gguf.GGUFReader`, dequantization by
qhx_export.dequant.

GGUF lists a tensor's dims fastest-first (ne0 = the contiguous `in` dim); its data is already
row-major with `in` contiguous, so only the shape list is reversed to get PyTorch order. A
family's `from_gguf_layout` then undoes llama.cpp's q/k row permutation where it has one.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from qhx_export import ExportError
from qhx_export.dequant import dequantize, nbytes, supported, type_name
from qhx_export.families import for_gguf_arch
from qhx_export.read.base import Checkpoint, as_meta
from qhx_export.tokenizer import Warn, _stderr_warn, tokenizer_json_bytes

MAGIC = b"GGUF"


@dataclass(frozen=True)
class GgufTensor:
    name: str
    qtype: int  # GGML type id
    shape: list[int]  # PyTorch order
    data: np.ndarray  # raw bytes (uint8 view of the memory map)


def _check_magic(path: str) -> None:
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise ExportError(f"{path}: cannot read ({e.strerror})") from e
    if head[:4] != MAGIC:
        raise ExportError(f"{path}: not a GGUF file (starts with {head[:4]!r}, not {MAGIC!r})")
    if len(head) < 8:
        raise ExportError(f"{path}: truncated GGUF file ({len(head)} bytes)")


class GgufCheckpoint(Checkpoint):
    def __init__(self, path: str, warn: Warn = _stderr_warn) -> None:
        import gguf

        self.path = path
        self.warn = warn
        _check_magic(path)
        try:
            reader = gguf.GGUFReader(path, "r")
        except Exception as e:  # ValueError / struct.error / IndexError on bad or cut files
            from qhx_export.read.gguf_cut import diagnose

            try:  # numpy's words at the point the reader stopped say nothing to a user
                why = diagnose(path)
            except (OSError, ValueError, struct.error):
                why = None
            if why is None:
                why = f"corrupt: gguf's reader stopped with {type(e).__name__}: {e}"
            raise ExportError(f"{path}: {why}") from e
        self.meta: dict[str, Any] = {}
        for key, field in reader.fields.items():
            if key.startswith("GGUF."):
                continue
            try:
                self.meta[key] = as_meta(field.contents())
            except Exception as e:
                raise ExportError(f"{path}: cannot decode metadata {key} ({e})") from e
        size = os.path.getsize(path)
        self.tensors: dict[str, GgufTensor] = {}
        for t in reader.tensors:
            qt = int(t.tensor_type)
            shape = [int(x) for x in reversed(t.shape.tolist())]
            if not supported(qt):
                raise ExportError(
                    f"{path}: tensor {t.name} is GGML {type_name(qt)}, which qhx-export "
                    "does not read (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, "
                    "Q5_K, Q6_K)"
                )
            need = nbytes(qt, shape)
            if int(t.data_offset) + need > size:
                raise ExportError(
                    f"{path}: truncated: tensor {t.name} needs bytes up to "
                    f"{int(t.data_offset) + need}, the file has {size}"
                )
            data = np.asarray(t.data).reshape(-1).view(np.uint8)
            if data.size != need:
                raise ExportError(f"{path}: tensor {t.name} holds {data.size} bytes, {need} expected")
            self.tensors[t.name] = GgufTensor(t.name, qt, shape, data)
        self.arch = self.meta.get("general.architecture")
        self.family = for_gguf_arch(self.arch, path)
        self.shapes = {n: t.shape for n, t in self.tensors.items()}
        self.config = self.family.config_from_gguf(self.meta, self.shapes, path)
        self.family.check_tensors(self.config, self.shapes, path)
        if "rope_freqs.weight" in self.tensors and not self.config.rope_scaling:
            warn(
                f"{path}: rope_freqs.weight (llama3 per-frequency divisors) is applied by the reference "
                "forward; bundles take RoPE scaling from the manifest's rope_scaling only"
            )

    def get(self, key: str, default: Any = None) -> Any:
        return self.meta.get(key, default)

    def float32(self, name: str) -> np.ndarray:
        t = self.tensors[name]
        arr = dequantize(t.data, t.qtype, t.shape, name)
        arr = self.family.from_gguf_layout(name, arr, self.config)
        return self.family.from_gguf_values(name, arr, self.config)

    def raw_rows(self, name: str) -> np.ndarray:
        """The stored bytes as [rows, row_bytes] (quantized blocks stay whole), HF row order."""
        t = self.tensors[name]
        if len(t.shape) > 1:
            rows = int(np.prod(t.shape[:-1]))
        else:  # a vector: one row per element when elements are whole bytes (f32 / f16 / bf16)
            rows = t.shape[0] if nbytes(t.qtype, [1]) else 1
        return self.family.from_gguf_layout(name, t.data.reshape(rows, -1), self.config)

    # ---- tokenizer / chat -------------------------------------------------------------------------

    def bos_token_id(self) -> int | None:
        bos = self.meta.get("tokenizer.ggml.bos_token_id")
        return int(bos) if self.meta.get("tokenizer.ggml.add_bos_token", False) and bos is not None else None

    def eos_token_id(self) -> int | None:
        eos = self.meta.get("tokenizer.ggml.eos_token_id")
        return int(eos) if eos is not None else None

    def chat_template(self) -> str | None:
        return self.meta.get("tokenizer.chat_template") or None

    def tokenizer_json(self) -> bytes:
        return tokenizer_json_bytes(self.meta, self.path, self.warn)

    def default_name(self) -> str:
        """SmolLM2-135M-Instruct.Q4_1.gguf -> smollm2-135m-instruct."""
        stem = re.sub(r"\.gguf$", "", os.path.basename(self.path), flags=re.I)
        stem = re.sub(r"[._-](I?Q\d\w*|F16|F32|BF16)$", "", stem, flags=re.I)
        return stem.lower()
