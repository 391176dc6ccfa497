"""`--quant-method rtn|seqmse|gptq`: how the 4-bit LPBQ weights are chosen, layer after layer.

`solve(ck, seqs, method)` walks the layers in order; for layer i it runs the family's reference
forward over the calibration sequences with the layers before i already quantized (their
dequantized weights in place), records the Hessian of every linear input of layer i
(quant/hessian.py), and picks each weight's LPBQ triple with the method (quant/gptq.py). The
result is by checkpoint tensor name, in MatMul layout [in, out]; quant/lpbq.py writes it into the
graphs. `rtn` needs no calibration: `lpbq.block_int4` on each weight.

`proxy(...)`: the same numpy forward with the chosen weights against the float one
(teacher-forced top-1 agreement, mean KL divergence): the CPU stand-in the methods are compared
with before anything is compiled. Activations stay float there (the bundles' are 16-bit).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from qhx_export import ExportError
from qhx_export.quant import gptq as solvers
from qhx_export.quant.hessian import LINEAR_KINDS, hessians
from qhx_export.quant.lpbq import BLOCK, block_int4
from qhx_export.read.base import Checkpoint

METHODS = ("rtn", "seqmse", "gptq", "seqmse+gptq")
Triple = tuple[np.ndarray, np.ndarray, np.ndarray]  # (q [K, N], k [K/B, N], ch [N])


def _log(msg: str) -> None:
    print(f"qhx-export: {msg}", file=sys.stderr, flush=True)


@dataclass
class Solution:
    """LPBQ triples by checkpoint weight name (MatMul layout), and what making them measured."""

    method: str
    triples: dict[str, Triple] = field(default_factory=dict)
    output_error: dict[str, float] = field(default_factory=dict)  # relative, on calibration inputs
    tokens: int = 0
    seconds: float = 0.0

    def dequantized(self) -> dict[str, np.ndarray]:
        """name -> the weight the bundle computes with, PyTorch layout [out, in]."""
        return {n: solvers.dequant(*t).T.copy() for n, t in self.triples.items()}

    def summary(self) -> dict[str, object]:
        errs = list(self.output_error.values())
        return {
            "method": self.method,
            "weights": len(self.triples),
            "calibration_tokens": self.tokens,
            "mean_relative_output_error": round(float(np.mean(errs)), 6) if errs else None,
            "seconds": round(self.seconds, 1),
        }


def linear_names(ck: Checkpoint, layer: int) -> list[str]:
    return [f"blk.{layer}.{k}.weight" for k in LINEAR_KINDS if f"blk.{layer}.{k}.weight" in ck.shapes]


def solve(
    ck: Checkpoint,
    seqs: Sequence[Sequence[int]],
    method: str,
    block: int = BLOCK,
    log: Callable[[str], None] = _log,
    skip: Sequence[str] = (),
    group: int = 1,
) -> Solution:
    """The LPBQ triple of every layer linear weight (except `skip` kinds, e.g. weights kept fp16).
    `group`: layers whose calibration inputs come from one forward (1: each layer sees every
    layer before it quantized; more: fewer forwards, the group's layers see the earlier groups
    quantized)."""
    if method not in METHODS:
        raise ExportError(f"--quant-method {method!r}: choose one of {', '.join(METHODS)}")
    t0 = time.monotonic()
    w = ck.weights()
    sol = Solution(method)
    done: dict[str, np.ndarray] = {}  # dequantized [out, in], fed to the later layers' forward
    L = ck.config.n_layers
    for g0 in range(0, L, max(1, group)):
        layers = set(range(g0, min(L, g0 + max(1, group))))
        names = [n for i in sorted(layers) for n in linear_names(ck, i) if n.split(".")[2] not in skip]
        if not names:
            continue
        hs: dict[str, np.ndarray] = {}
        if method != "rtn":
            hs, sol.tokens = hessians(ck, seqs, layers, w, done)
        for n in names:
            wk = np.asarray(w[n], np.float32).T  # [in, out]
            if method == "rtn":
                t = block_int4(wk, block)
            elif n not in hs:
                raise ExportError(f"--quant-method {method}: no calibration input reached {n}")
            elif method == "gptq":
                t = solvers.gptq(wk, hs[n], block)
            elif method == "seqmse+gptq":
                t = solvers.seqmse_gptq(wk, hs[n], block)
            else:
                t = solvers.seqmse(wk, hs[n], block)
            sol.triples[n] = t
            deq = solvers.dequant(*t, block=block)
            if n in hs:
                sol.output_error[n] = solvers.output_error(wk, deq, hs[n])
            done[n] = deq.T.copy()
        if method != "rtn":
            log(f"{method}: layers to {max(layers) + 1}/{L} ({time.monotonic() - t0:.0f}s)")
    sol.seconds = time.monotonic() - t0
    return sol


class Replaced(Mapping[str, np.ndarray]):
    """`base` with some tensors replaced."""

    def __init__(self, base: Mapping[str, np.ndarray], replace: Mapping[str, np.ndarray]) -> None:
        self.base, self.replace = base, replace

    def __getitem__(self, name: str) -> np.ndarray:
        return self.replace[name] if name in self.replace else self.base[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.base)

    def __len__(self) -> int:
        return len(self.base)


@dataclass
class Proxy:
    """A quantized forward against the float one, teacher-forced over the same ids."""

    agreement: float  # share of positions whose top-1 equals the float forward's (or the gold)
    kld: float  # mean KL(float || quantized) in nats per position
    per_seq: list[float]
    positions: int


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def kl(ref_logits: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """KL(p_ref || p) per row, nats."""
    lp, lq = log_softmax(ref_logits), log_softmax(logits)
    return (np.exp(lp) * (lp - lq)).sum(-1)


def proxy(
    ck: Checkpoint,
    cases: Sequence[tuple[Sequence[int], Sequence[int] | None, int]],
    replace: Mapping[str, np.ndarray],
    weights: Mapping[str, np.ndarray] | None = None,
) -> Proxy:
    """cases: (ids, gold, first) — the forward over `ids`, scored at positions first.. (the
    prediction of ids[p + 1]); top-1 against `gold` when given (the gold tokens, in order), else
    against the float forward's argmax."""
    base = weights if weights is not None else ck.weights()
    q = Replaced(base, replace)
    agree, klds, per = 0, [], []
    n = 0
    for ids, gold, first in cases:
        ref = ck.family.forward(ck.config, base, list(ids))[first:]
        got = ck.family.forward(ck.config, q, list(ids))[first:]
        want = np.asarray(gold[: len(got)]) if gold is not None else ref.argmax(-1)
        hit = got.argmax(-1)[: len(want)] == want
        agree += int(hit.sum())
        n += len(want)
        per.append(float(hit.mean()))
        klds.append(kl(ref, got))
    return Proxy(agree / max(n, 1), float(np.concatenate(klds).mean()), per, n)
