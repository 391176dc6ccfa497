"""Our dequantization against gguf's (independent code: qhx_export.dequant never imports gguf)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from qhx_export import ExportError
from qhx_export.dequant import BLOCK, GgmlType, dequantize

# byte offsets of the f16 scale fields in each block (random bytes there could be NaN / Inf)
F16_FIELDS = {
    GgmlType.Q4_0: [0],
    GgmlType.Q4_1: [0, 2],
    GgmlType.Q5_0: [0],
    GgmlType.Q5_1: [0, 2],
    GgmlType.Q8_0: [0],
    GgmlType.Q4_K: [0, 2],
    GgmlType.Q5_K: [0, 2],
    GgmlType.Q6_K: [208],
}


def random_blocks(t: GgmlType, n: int, rng: np.random.Generator) -> np.ndarray:
    size = BLOCK[t][1]
    if t == GgmlType.F32:
        return rng.standard_normal(n).astype("<f4").view(np.uint8).reshape(n, 4)
    if t == GgmlType.F16:
        return rng.standard_normal(n).astype("<f2").view(np.uint8).reshape(n, 2)
    if t == GgmlType.BF16:
        f = rng.standard_normal(n).astype("<f4").view("<u4") >> 16
        return f.astype("<u2").view(np.uint8).reshape(n, 2)
    raw = rng.integers(0, 256, (n, size), dtype=np.uint8)
    for off in F16_FIELDS[t]:
        raw[:, off : off + 2] = (rng.standard_normal((n, 1)) * 0.05).astype("<f2").view(np.uint8)
    return raw


@pytest.mark.parametrize("t", list(BLOCK), ids=lambda t: t.name)
def test_matches_gguf_bit_for_bit(t: GgmlType) -> None:
    rng = np.random.default_rng(int(t) + 100)
    values, _ = BLOCK[t]
    n_blocks = 96 if values > 1 else 96 * 256
    raw = random_blocks(t, n_blocks, rng)
    ours = dequantize(raw, t, [n_blocks * values // 256, 256] if values > 1 else [n_blocks // 256, 256])
    theirs = gguf.quants.dequantize(raw.reshape(-1), gguf.GGMLQuantizationType(int(t)))
    assert ours.dtype == np.float32
    assert np.isfinite(ours).all()
    assert np.array_equal(ours.reshape(-1), np.asarray(theirs).reshape(-1))
    assert ours.std() > 0  # the comparison saw real values


@pytest.mark.parametrize(
    "t", [GgmlType.Q4_0, GgmlType.Q4_1, GgmlType.Q5_0, GgmlType.Q5_1, GgmlType.Q8_0], ids=lambda t: t.name
)
def test_round_trips_gguf_quantize(t: GgmlType) -> None:
    """Blocks made by gguf's quantizer decode to values close to the input."""
    x = np.random.default_rng(9).standard_normal((8, 64)).astype(np.float32)
    q = gguf.quants.quantize(x, gguf.GGMLQuantizationType(int(t)))
    y = dequantize(q, t, x.shape)
    assert np.abs(y - x).max() < (0.12 if t in (GgmlType.Q5_0, GgmlType.Q5_1, GgmlType.Q8_0) else 0.5)


def test_known_q8_0_block() -> None:
    block = np.zeros(34, np.uint8)
    block[0:2] = np.array([0.5], "<f2").view(np.uint8)
    block[2:34] = np.arange(-16, 16, dtype=np.int8).view(np.uint8)
    assert dequantize(block, GgmlType.Q8_0, [32]).tolist() == [v * 0.5 for v in range(-16, 16)]


def test_known_q4_1_nibble_order() -> None:
    """Byte j holds value j (low nibble) and value j + 16 (high nibble)."""
    block = np.zeros(20, np.uint8)
    block[0:2] = np.array([1.0], "<f2").view(np.uint8)
    block[2:4] = np.array([-8.0], "<f2").view(np.uint8)
    block[4:20] = np.arange(16, dtype=np.uint8) | (np.uint8(15) - np.arange(16, dtype=np.uint8)) << 4
    y = dequantize(block, GgmlType.Q4_1, [32])
    assert y[:16].tolist() == [v - 8.0 for v in range(16)]
    assert y[16:].tolist() == [7.0 - v for v in range(16)]


def test_errors_name_the_tensor() -> None:
    with pytest.raises(ExportError, match=r"blk\.0\.attn_q\.weight: GGML Q2_K is not supported"):
        dequantize(np.zeros(84, np.uint8), 10, [256], "blk.0.attn_q.weight")
    with pytest.raises(ExportError, match=r"w: row length 30 is not a multiple of the Q8_0 block"):
        dequantize(np.zeros(34, np.uint8), GgmlType.Q8_0, [30], "w")
    with pytest.raises(ExportError, match=r"w: 33 bytes of Q8_0 data, 34 expected"):
        dequantize(np.zeros(33, np.uint8), GgmlType.Q8_0, [32], "w")
