"""Error-minimising choices on the LPBQ grid (quant/lpbq.py): GPTQ and a SeqMSE-style search.

Both take a weight in MatMul layout w [K, N] and the Hessian H = X.T X [K, K] of its input over
the calibration tokens, and return the LPBQ triple (q int4 [K, N], k uint8 [K/B, N], ch f32 [N])
that `lpbq.block_int4` would, but chosen to make ||X (W - W_q)||^2 small rather than each weight
nearest:

* GPTQ (Frantar et al. 2022): input rows quantized in order, each row's rounding error spread
  over the rows not yet quantized through the Cholesky factor of H^-1 (damped), in lazy batches
  of one LPBQ block. A block's 4-bit multipliers are set from the weights as they stand when the
  block is reached (after the earlier blocks' compensation), the per-channel scale from the
  original weights, so the grid is the one the HTP runs.
* SeqMSE (AIMET's sequential MSE): per output channel a shrink factor of the per-channel scale
  from a grid, then per block a multiplier among the neighbours of the nearest one, each choice
  minimising the output error e.T H e of that channel (for the block choice the error inside the
  block, H's diagonal block). No error compensation, so the weights stay round-to-nearest on the
  chosen scales.
"""

from __future__ import annotations

import numpy as np

from qhx_export import ExportError
from qhx_export.quant.lpbq import BLOCK, block_int4

DAMP = 0.01  # GPTQ's relative damping: H + DAMP * mean(diag H) * I
SHRINK = np.linspace(0.55, 1.0, 19)  # SeqMSE's per-channel scale candidates


def _ch(w: np.ndarray, block: int) -> np.ndarray:
    return block_int4(w, block)[2]


def _damped(h: np.ndarray, damp: float) -> tuple[np.ndarray, np.ndarray]:
    """(H with dead inputs made harmless and damping added, mask of the dead inputs)."""
    h = np.array(h, np.float64, copy=True)
    dead = np.diag(h) <= 0
    h[dead, dead] = 1.0
    d = np.arange(h.shape[0])
    h[d, d] += damp * float(np.mean(np.diag(h)))
    return h, dead


def gptq(
    w: np.ndarray, h: np.ndarray, block: int = BLOCK, damp: float = DAMP, fixed_k: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GPTQ on the LPBQ grid: (q, k, ch) for w [K, N] given H [K, K]. `fixed_k`: the block
    multipliers to use (e.g. SeqMSE's) instead of setting them as each block is reached."""
    K, N = w.shape
    if h.shape != (K, K):
        raise ExportError(f"GPTQ: Hessian {h.shape} does not match a weight of {K} input rows")
    if K % block:
        raise ExportError(f"GPTQ: {K} input rows are not a multiple of the block ({block})")
    ch = _ch(w, block).astype(np.float64)
    hd, dead = _damped(h, damp)
    W = w.astype(np.float64).copy()
    W[dead, :] = 0.0
    try:
        # upper factor U of H^-1 = U.T U: row j of U carries input j's error onto inputs after it
        hinv = np.linalg.inv(hd)
        U = np.linalg.cholesky(hinv).T
    except np.linalg.LinAlgError as e:
        raise ExportError(f"GPTQ: the calibration Hessian is not positive definite ({e})") from e
    q = np.zeros((K, N), np.int8)
    kk = np.zeros((K // block, N), np.uint8)
    for b0 in range(0, K, block):
        b1 = b0 + block
        Wb = W[b0:b1].copy()
        if fixed_k is not None:
            kb = fixed_k[b0 // block].astype(np.float64)
        else:
            kb = np.clip(np.ceil(np.abs(Wb).max(axis=0) / 7.0 / ch - 1e-6), 1, 15)
        kk[b0 // block] = kb.astype(np.uint8)
        scale = ch * kb
        Ub = U[b0:b1, b0:b1]
        err = np.zeros((block, N))
        for j in range(block):
            qj = np.clip(np.round(Wb[j] / scale), -8, 7)
            q[b0 + j] = qj.astype(np.int8)
            e = (Wb[j] - qj * scale) / Ub[j, j]
            Wb[j + 1 :] -= np.outer(Ub[j, j + 1 :], e)
            err[j] = e
        W[b1:] -= U[b0:b1, b1:].T @ err
    return q, kk, ch.astype(np.float32)


def _rtn(w: np.ndarray, ch: np.ndarray, k: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Round-to-nearest on block scales ch * k: (q, dequantized)."""
    scale = np.repeat(ch[None, :] * k, block, axis=0)
    q = np.clip(np.round(w / scale), -8, 7)
    return q, q * scale


def _block_losses(e: np.ndarray, hb: np.ndarray) -> np.ndarray:
    """e [K, N] -> [K/B, N]: each block's e_b.T H_bb e_b (hb: H's diagonal blocks [K/B, B, B])."""
    nb, B, _ = hb.shape
    eb = e.reshape(nb, B, -1)
    return np.einsum("bin,bij,bjn->bn", eb, hb, eb)


def seqmse(
    w: np.ndarray, h: np.ndarray, block: int = BLOCK, shrink: np.ndarray = SHRINK
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SeqMSE-style scale search on the LPBQ grid: (q, k, ch) for w [K, N] given H [K, K]."""
    K, N = w.shape
    if h.shape != (K, K):
        raise ExportError(f"SeqMSE: Hessian {h.shape} does not match a weight of {K} input rows")
    W = w.astype(np.float64)
    H = np.asarray(h, np.float64)
    nb = K // block
    blocks = W.reshape(nb, block, N)
    need = np.abs(blocks).max(axis=1) / 7.0  # [K/B, N]
    ch0 = need.max(axis=0) / 15.0
    ch0[ch0 == 0] = 1.0
    # 1. per channel: the shrink of every block's scale with the least output error (full H)
    best_loss = np.full(N, np.inf)
    best_a = np.ones(N)
    for a in shrink:
        k = np.clip(np.ceil(a * need / ch0 - 1e-6), 1, 15)
        _, deq = _rtn(W, ch0, k, block)
        e = W - deq
        loss = np.einsum("kn,kn->n", e, H @ e)
        better = loss < best_loss
        best_loss[better], best_a[better] = loss[better], a
    k = np.clip(np.ceil(best_a[None, :] * need / ch0 - 1e-6), 1, 15)
    # 2. per block: the multiplier, among the chosen one and its neighbours, with the least
    # error inside the block
    hb = np.stack([H[i : i + block, i : i + block] for i in range(0, K, block)])
    best_k = k.copy()
    _, deq = _rtn(W, ch0, k, block)
    best_bl = _block_losses(W - deq, hb)
    for dk in (-2, -1, 1):
        kc = np.clip(k + dk, 1, 15)
        _, deq = _rtn(W, ch0, kc, block)
        bl = _block_losses(W - deq, hb)
        better = bl < best_bl
        best_bl[better], best_k[better] = bl[better], kc[better]
    q, _ = _rtn(W, ch0, best_k, block)
    return q.astype(np.int8), best_k.astype(np.uint8), ch0.astype(np.float32)


def seqmse_gptq(
    w: np.ndarray, h: np.ndarray, block: int = BLOCK
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SeqMSE's block scales, then GPTQ's error-compensating rounding on them."""
    _, k, _ = seqmse(w, h, block)
    return gptq(w, h, block, fixed_k=k)


def dequant(q: np.ndarray, k: np.ndarray, ch: np.ndarray, block: int = BLOCK) -> np.ndarray:
    """The float weight [K, N] an LPBQ triple stands for."""
    return (q.astype(np.float32) * np.repeat(ch[None, :] * k.astype(np.float32), block, axis=0)).astype(
        np.float32
    )


def output_error(w: np.ndarray, wq: np.ndarray, h: np.ndarray) -> float:
    """tr(E.T H E) / tr(W.T H W): the relative output error of wq in place of w on the inputs H."""
    e = (w - wq).astype(np.float64)
    W = w.astype(np.float64)
    return float(np.einsum("kn,kn->", e, h @ e) / max(np.einsum("kn,kn->", W, h @ W), 1e-30))
