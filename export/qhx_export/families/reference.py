"""The numpy float32 reference forward's building blocks, shared by every family's `forward`."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from qhx_export.families.config import Config

Weights = Mapping[str, np.ndarray]


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    var = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True, dtype=np.float32)
    return (x / np.sqrt(var + np.float32(eps))).astype(np.float32) * w


def inv_freq(c: Config, freq_factors: np.ndarray | None = None) -> np.ndarray:
    """RoPE inverse frequencies [head_dim / 2], with llama3 scaling (or GGUF rope_freqs divisors)."""
    d = c.head_dim
    inv = 1.0 / np.power(np.float32(c.rope_theta), np.arange(0, d, 2, dtype=np.float32) / np.float32(d))
    inv = inv.astype(np.float32)
    if freq_factors is not None:
        return (inv / np.asarray(freq_factors, np.float32)).astype(np.float32)
    rs = c.rope_scaling
    if not rs:
        return inv
    factor = float(rs["factor"])
    low, high = float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old = float(rs["original_max_position_embeddings"])
    wavelen = 2.0 * math.pi / inv.astype(np.float64)
    smooth = (old / wavelen - low) / (high - low)
    scaled = np.where(
        wavelen > old / low,
        inv / factor,
        np.where(wavelen < old / high, inv, (1.0 - smooth) * inv / factor + smooth * inv),
    )
    return scaled.astype(np.float32)


def rotate_half_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [T, heads, d]; cos/sin [T, d/2]: HF's rotate-half RoPE (pairs i, i + d/2)."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1).astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    return (x / (np.float32(1.0) + np.exp(-x))).astype(np.float32)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (PyTorch's gelu(approximate="tanh"), HF's gelu_pytorch_tanh)."""
    x = np.asarray(x, np.float32)
    inner = np.float32(math.sqrt(2.0 / math.pi)) * (x + np.float32(0.044715) * x * x * x)
    return (np.float32(0.5) * x * (np.float32(1.0) + np.tanh(inner))).astype(np.float32)


def rope_tables(
    c: Config, T: int, theta: float | None = None, freq_factors: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [T, head_dim / 2] for positions 0..T-1; `theta` overrides the base (no scaling)."""
    if theta is None:
        inv = inv_freq(c, freq_factors)
    else:
        d = c.head_dim
        inv = (
            1.0 / np.power(np.float32(theta), np.arange(0, d, 2, dtype=np.float32) / np.float32(d))
        ).astype(np.float32)
    ang = np.arange(T, dtype=np.float32)[:, None] * inv[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def attention(c: Config, q: np.ndarray, k: np.ndarray, v: np.ndarray, hidden: np.ndarray) -> np.ndarray:
    """Softmax attention of q [T, n_heads, d] over k, v [T, n_kv, d] (after RoPE); `hidden` [T, T]
    is True where a query may not see a key. Returns [T, n_heads * d]; GQA maps query head j to
    KV head j // (n_heads / n_kv_heads)."""
    T, d, g = q.shape[0], c.head_dim, c.n_heads // c.n_kv_heads
    qg = q.reshape(T, c.n_kv_heads, g, d).transpose(1, 2, 0, 3)  # [kv, g, T, d]
    kt = k.transpose(1, 2, 0)[:, None]  # [kv, 1, d, T]
    s = (qg @ kt) * np.float32(c.score_scale)  # [kv, g, T, T]
    s = np.where(hidden, np.float32(-np.inf), s)
    s = np.exp(s - s.max(-1, keepdims=True))
    p = (s / s.sum(-1, keepdims=True)).astype(np.float32)
    o = p @ v.transpose(1, 0, 2)[:, None]  # [kv, g, T, d]
    return o.transpose(2, 0, 1, 3).reshape(T, c.q_rows).astype(np.float32)


def swiglu_residual(c: Config, w: Weights, b: str, x: np.ndarray) -> np.ndarray:
    """x + down(silu(gate(n)) * up(n)), n = RMSNorm(x): the FFN half of a layer `b` ("blk.i.")."""
    n = rms_norm(x, w[b + "ffn_norm.weight"], c.rms_eps)
    m = silu(n @ w[b + "ffn_gate.weight"].T) * (n @ w[b + "ffn_up.weight"].T)
    return (x + m @ w[b + "ffn_down.weight"].T).astype(np.float32)


def final_logits(
    c: Config, w: Weights, x: np.ndarray, peak: float, trace: dict[str, float] | None
) -> np.ndarray:
    """The residual stream's last |x| into `peak` (recorded in `trace`), the final RMSNorm and
    the (tied or own) vocabulary projection: float32 logits [T, vocab]."""
    peak = max(peak, float(np.abs(x).max()))
    if trace is not None:
        trace["residual_max"] = max(trace.get("residual_max", 0.0), peak)
    x = rms_norm(x, w["output_norm.weight"], c.rms_eps)
    head = w["token_embd.weight"] if c.tied else w["output.weight"]
    return (x @ np.asarray(head, np.float32).T).astype(np.float32)
