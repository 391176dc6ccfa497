"""GGML tensor types and their dequantization to float32, vectorized with numpy.

Written from the GGML block layouts (the `block_*` structs of ggml-common.h and the reference
`dequantize_row_*` loops of ggml-quants.c). Each function takes the raw blocks as a uint8 array of
shape [n_blocks, block_bytes] and returns float32 values [n_blocks, block_values], computed with
the same float32 operations in the same order as the reference loop (d * q + m, (d * sc) * q,
(d * sc) * q - dmin * m), so the result is bit-exact with ggml's own C code and with
`gguf.quants.dequantize` (which the tests check on random blocks). No code here calls `gguf`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from enum import IntEnum

import numpy as np

from qhx_export import ExportError

QK = 32  # values per block of the legacy quants
QK_K = 256  # values per super-block of the k-quants


class GgmlType(IntEnum):
    """GGML tensor type ids as stored in a GGUF tensor info (the types this package reads)."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    BF16 = 30


# type -> (values per block, bytes per block)
BLOCK: dict[GgmlType, tuple[int, int]] = {
    GgmlType.F32: (1, 4),
    GgmlType.F16: (1, 2),
    GgmlType.BF16: (1, 2),
    GgmlType.Q4_0: (QK, 2 + QK // 2),
    GgmlType.Q4_1: (QK, 4 + QK // 2),
    GgmlType.Q5_0: (QK, 2 + 4 + QK // 2),
    GgmlType.Q5_1: (QK, 4 + 4 + QK // 2),
    GgmlType.Q8_0: (QK, 2 + QK),
    GgmlType.Q4_K: (QK_K, 4 + 12 + QK_K // 2),
    GgmlType.Q5_K: (QK_K, 4 + 12 + QK_K // 8 + QK_K // 2),
    GgmlType.Q6_K: (QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),
}


def _f16(cols: np.ndarray) -> np.ndarray:
    """Two uint8 columns holding a little-endian f16 -> float32 column [n, 1]."""
    return np.ascontiguousarray(cols).view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, k] bytes -> [n, 2k]: all low nibbles, then all high nibbles."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _f32(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view("<f4").astype(np.float32)


def _f16_values(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)


def _bf16(b: np.ndarray) -> np.ndarray:
    # bf16 is the top half of an f32: widen the bit pattern, then reinterpret
    hi = np.ascontiguousarray(b).view("<u2").astype(np.uint32) << np.uint32(16)
    return hi.view(np.float32)


def _q4_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])
    q = _nibbles(b[:, 2:18]).astype(np.int8) - np.int8(8)
    return d * q.astype(np.float32)


def _q4_1(b: np.ndarray) -> np.ndarray:
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    return d * _nibbles(b[:, 4:20]).astype(np.float32) + m


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """The 32 high bits of a Q5 block (a little-endian u32, bit j for value j) -> [n, 32] uint8."""
    h = np.ascontiguousarray(qh).view("<u4")  # [n, 1]
    return ((h >> np.arange(QK, dtype=np.uint32)) & np.uint32(1)).astype(np.uint8)


def _q5_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])
    q = (_nibbles(b[:, 6:22]) | (_fifth_bits(b[:, 2:6]) << 4)).astype(np.int8) - np.int8(16)
    return d * q.astype(np.float32)


def _q5_1(b: np.ndarray) -> np.ndarray:
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    q = _nibbles(b[:, 8:24]) | (_fifth_bits(b[:, 4:8]) << 4)
    return d * q.astype(np.float32) + m


def _q8_0(b: np.ndarray) -> np.ndarray:
    d = _f16(b[:, 0:2])
    return d * np.ascontiguousarray(b[:, 2:34]).view(np.int8).astype(np.float32)


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: 12 bytes -> eight 6-bit scales and eight 6-bit mins, [n, 8] each.

    Sub-blocks 0-3 keep scale and min in the low 6 bits of bytes 0-3 and 4-7; sub-blocks 4-7 take
    their low 4 bits from the nibbles of bytes 8-11 and their top 2 bits from the top of 0-3 / 4-7.
    """
    sc = np.empty((s.shape[0], 8), np.uint8)
    mn = np.empty((s.shape[0], 8), np.uint8)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc.astype(np.float32), mn.astype(np.float32)


def _k_low_bits(qs: np.ndarray) -> np.ndarray:
    """128 bytes of a Q4_K/Q5_K super-block -> [n, 8, 32]: 32-byte chunk c gives sub-block 2c
    (low nibbles) and 2c + 1 (high nibbles)."""
    q = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([q & 0x0F, q >> 4], axis=2).reshape(-1, 8, 32)


def _q4_k(b: np.ndarray) -> np.ndarray:
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    q = _k_low_bits(b[:, 16:144]).astype(np.float32)
    y = (d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]
    return y.reshape(-1, QK_K)


def _q5_k(b: np.ndarray) -> np.ndarray:
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    qh = b[:, 16:48]  # bit j of byte l: fifth bit of value l of sub-block j
    high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    q = (_k_low_bits(b[:, 48:176]) | (high << 4)).astype(np.float32)
    y = (d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]
    return y.reshape(-1, QK_K)


def _q6_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 2, 32)  # [half, first/second 32 bytes of the half's 64, l]
    qh = b[:, 128:192].reshape(n, 2, 1, 32)  # [half, 1, l]
    scales = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32)  # one per 16
    d = _f16(b[:, 208:210])
    # value 32k + l of a half: k=0 low nibble of ql[l], 1 low of ql[l+32], 2 high of ql[l],
    # 3 high of ql[l+32]; its top 2 bits are bits 2k, 2k+1 of qh[l]
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2)  # [n, 2, 4, 32]
    high = (qh >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3
    q = ((low | (high << 4)).astype(np.int8) - np.int8(32)).astype(np.float32)
    y = (d * scales)[:, :, None] * q.reshape(n, 16, 16)
    return y.reshape(n, QK_K)


_DECODERS: dict[GgmlType, Callable[[np.ndarray], np.ndarray]] = {
    GgmlType.F32: _f32,
    GgmlType.F16: _f16_values,
    GgmlType.BF16: _bf16,
    GgmlType.Q4_0: _q4_0,
    GgmlType.Q4_1: _q4_1,
    GgmlType.Q5_0: _q5_0,
    GgmlType.Q5_1: _q5_1,
    GgmlType.Q8_0: _q8_0,
    GgmlType.Q4_K: _q4_k,
    GgmlType.Q5_K: _q5_k,
    GgmlType.Q6_K: _q6_k,
}


def supported(qtype: int) -> bool:
    return qtype in BLOCK


# names of the GGML types this package does not read, for error messages
OTHER_TYPES = {
    9: "Q8_1",
    10: "Q2_K",
    11: "Q3_K",
    15: "Q8_K",
    16: "IQ2_XXS",
    17: "IQ2_XS",
    18: "IQ3_XXS",
    19: "IQ1_S",
    20: "IQ4_NL",
    21: "IQ3_S",
    22: "IQ2_S",
    23: "IQ4_XS",
    24: "I8",
    25: "I16",
    26: "I32",
    27: "I64",
    28: "F64",
    29: "IQ1_M",
    34: "TQ1_0",
    35: "TQ2_0",
    39: "MXFP4",
}


def type_name(qtype: int) -> str:
    if qtype in BLOCK:
        return GgmlType(qtype).name
    return OTHER_TYPES.get(qtype, f"type {qtype}")


def nbytes(qtype: int, shape: Sequence[int]) -> int:
    """Bytes a tensor of this type and (any-order) shape occupies."""
    values, size = BLOCK[GgmlType(qtype)]
    return math.prod(shape) // values * size


def dequantize(raw: np.ndarray, qtype: int, shape: Sequence[int], what: str = "tensor") -> np.ndarray:
    """Raw GGML data of a tensor -> float32 array of `shape` (PyTorch order: last dim contiguous).

    `what` names the tensor in error messages.
    """
    if qtype not in BLOCK:
        raise ExportError(
            f"{what}: GGML {type_name(qtype)} is not supported "
            f"(supported: {', '.join(t.name for t in BLOCK)})"
        )
    t = GgmlType(qtype)
    values, size = BLOCK[t]
    shape = [int(x) for x in shape]
    if not shape or shape[-1] % values:
        raise ExportError(
            f"{what}: row length {shape[-1] if shape else 0} is not a multiple of "
            f"the {t.name} block ({values})"
        )
    data = np.asarray(raw).reshape(-1).view(np.uint8)
    want = math.prod(shape) // values * size
    if data.size != want:
        raise ExportError(f"{what}: {data.size} bytes of {t.name} data, {want} expected for {shape}")
    out = _DECODERS[t](data.reshape(-1, size))
    return out.reshape(shape)
