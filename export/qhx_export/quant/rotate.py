"""`--rotate hadamard`: an orthogonal rotation of the residual stream folded into the weights
(QuaRot / SpinQuant's R1), so no op is added to any graph.

With the stream x carried as x Q (Q orthogonal: RMSNorm commutes with it, the norm of each row
is kept), every weight reading the stream absorbs its norm's scale and Q, and every weight
writing it absorbs Q's transpose (weights [out, in], y = x @ W.T):

    token_embd  E Q                 attn_q/k/v, ffn_gate/up   W diag(g) Q   (g: the norm before)
    attn_output, ffn_down  Q.T W    head (output.weight)      H diag(g_out) Q
    attn_norm, ffn_norm, output_norm  ones

A tied embedding is untied (the host table and the head now differ). The float model is the
same function; what changes is the weights' spread: a few channels of huge activations and
weights (SmolLM2's residual stream reaches ~22,000) are mixed over all of them, which is what a
per-channel or per-block grid wants. Q is a Hadamard matrix with random signs where one is
built here (2^a times up to two of 12 and 20: Sylvester's and Paley's constructions; SmolLM2's
576 = 12 * 12 * 4), else a random orthogonal matrix; families with norms after a sublayer's
output (Gemma 3) or convolution layers (LFM2) cannot fold it and are refused.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from qhx_export import ExportError
from qhx_export.read.base import Checkpoint

ROTATIONS = ("none", "hadamard", "auto")  # auto: hadamard where the family can fold it
SEED = 0x5EED


def _paley(q: int) -> np.ndarray:
    """Paley's construction I: a Hadamard matrix of order q + 1 for a prime q = 3 (mod 4)."""
    residues = {(i * i) % q for i in range(1, q)}
    chi = np.array([0] + [1 if i in residues else -1 for i in range(1, q)])
    jac = np.array([[chi[(j - i) % q] for j in range(q)] for i in range(q)])
    s = np.zeros((q + 1, q + 1), np.int64)
    s[0, 1:] = 1
    s[1:, 0] = -1
    s[1:, 1:] = jac
    return s + np.eye(q + 1, dtype=np.int64)


def hadamard(n: int) -> np.ndarray | None:
    """A Hadamard matrix of order n (entries +-1, H H.T = n I), or None when none is built here:
    Kronecker products of Paley's 12 and 20 (at most two of them) with Sylvester's doubling."""
    for factors in ((), (12,), (20,), (12, 12), (12, 20), (20, 20)):
        m = int(np.prod(factors)) if factors else 1
        if n % m or (n // m) & (n // m - 1):
            continue
        h = np.ones((1, 1), np.int64)
        for f in factors:
            h = np.kron(h, _paley(f - 1))
        while h.shape[0] < n:
            h = np.block([[h, h], [h, -h]])
        return h
    return None


def rotation(n: int, seed: int = SEED) -> tuple[np.ndarray, str]:
    """(Q [n, n] orthogonal float64, how it was made)."""
    rng = np.random.default_rng(seed)
    h = hadamard(n)
    if h is not None:
        signs = rng.choice([-1.0, 1.0], size=n)
        return (signs[:, None] * h) / np.sqrt(n), f"randomized Hadamard {n} (seed {seed:#x})"
    qm, r = np.linalg.qr(rng.standard_normal((n, n)))
    return qm * np.sign(np.diag(r))[None, :], f"random orthogonal {n} (QR, seed {seed:#x})"


READ_STREAM = ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up")
WRITE_STREAM = ("attn_output", "ffn_down")


def foldable(c: object) -> bool:
    """Whether a rotation of the residual stream folds into this config's weights."""
    return not (
        getattr(c, "post_norms", False)
        or getattr(c, "layer_types", None) is not None
        or getattr(c, "norm_offset", 0.0)
    )


class RotatedCheckpoint(Checkpoint):
    """`base` with the residual stream rotated by Q (same function, other weights)."""

    def __init__(self, base: Checkpoint, q: np.ndarray, how: str) -> None:
        c = base.config
        if not foldable(c):
            raise ExportError(
                f"--rotate hadamard: {base.family.name} cannot fold a rotation of its residual stream "
                "(norms after the sublayers, convolution layers or offset norms); use --rotate none"
            )
        self.base, self.q, self.how = base, q, how
        self.path = base.path
        self.family = base.family
        self.config = replace(c, tied=False)
        self.shapes = dict(base.shapes)
        if c.tied:
            self.shapes["output.weight"] = list(base.shapes["token_embd.weight"])

    def float32(self, name: str) -> np.ndarray:
        q = self.q
        parts = name.split(".")
        if name == "token_embd.weight":
            return (self.base.float32(name).astype(np.float64) @ q).astype(np.float32)
        if name == "output.weight":
            src = "token_embd.weight" if self.base.config.tied else "output.weight"
            g = self.base.float32("output_norm.weight").astype(np.float64)
            return ((self.base.float32(src).astype(np.float64) * g[None, :]) @ q).astype(np.float32)
        if name in ("output_norm.weight",) or (len(parts) == 4 and parts[2] in ("attn_norm", "ffn_norm")):
            return np.ones(self.base.shapes[name], np.float32)
        if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight":
            kind = parts[2]
            if kind in READ_STREAM:
                norm = "attn_norm" if kind.startswith("attn") else "ffn_norm"
                g = self.base.float32(f"blk.{parts[1]}.{norm}.weight").astype(np.float64)
                w = self.base.float32(name).astype(np.float64)
                return ((w * g[None, :]) @ q).astype(np.float32)
            if kind in WRITE_STREAM:
                return (q.T @ self.base.float32(name).astype(np.float64)).astype(np.float32)
        return self.base.float32(name)

    def n_params(self) -> int:
        return self.base.n_params()

    def bos_token_id(self) -> int | None:
        return self.base.bos_token_id()

    def eos_token_id(self) -> int | list[int] | None:
        return self.base.eos_token_id()

    def chat_template(self) -> str | None:
        return self.base.chat_template()

    def tokenizer_json(self) -> bytes:
        return self.base.tokenizer_json()

    def default_name(self) -> str:
        return self.base.default_name()

    def __getattr__(self, attr: str) -> object:  # reader-specific facts (GGUF path, metadata)
        return getattr(self.base, attr)


def rotated(ck: Checkpoint, how: str) -> Checkpoint:
    """`ck` itself for none (and auto where the family cannot fold it), else its rotated view."""
    if how == "none" or (how == "auto" and not foldable(ck.config)):
        return ck
    if how not in ("hadamard", "auto"):
        raise ExportError(f"--rotate {how!r}: choose one of {', '.join(ROTATIONS)}")
    q, desc = rotation(ck.config.hidden)
    return RotatedCheckpoint(ck, q, desc)
