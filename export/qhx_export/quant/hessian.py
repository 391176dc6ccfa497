"""Calibration statistics of every linear layer's input, from the numpy reference forward.

GPTQ and SeqMSE weigh a weight's error by what the layer sees: for y = x @ W.T over the
calibration tokens X [T, K], the output error of W + E is ||X E.T||^2 = tr(E H E.T) with
H = X.T X [K, K]. The family forwards read each weight as `h @ w[name].T`; `Tap` is the weight
array that records its left operand when it takes part in that product, so every family's own
forward yields the statistics without a second implementation of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from qhx_export.read.base import Checkpoint

# the layer weights the HTP graphs quantize to 4 bits (families/names.py suffixes)
LINEAR_KINDS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def is_linear(name: str) -> bool:
    parts = name.split(".")
    return len(parts) == 4 and parts[0] == "blk" and parts[2] in LINEAR_KINDS and parts[3] == "weight"


def layer_of(name: str) -> int:
    return int(name.split(".")[1])


class StopForward(Exception):
    """Raised by a tap once the layers asked for have been seen (the rest is not computed)."""


class Tap(np.ndarray):
    """A weight that reports its input: `x @ tap.T` calls `on_input(name, x)` first."""

    name: str
    on_input: Callable[[str, np.ndarray], None] | None

    def __array_finalize__(self, obj: Any) -> None:
        self.name = getattr(obj, "name", "")
        self.on_input = getattr(obj, "on_input", None)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if ufunc is np.matmul and method == "__call__" and len(inputs) == 2 and inputs[1] is self:
            x = inputs[0]
            if self.on_input is not None and not isinstance(x, Tap):
                self.on_input(self.name, np.asarray(x))
        plain = [np.asarray(i) if isinstance(i, Tap) else i for i in inputs]
        return getattr(ufunc, method)(*plain, **kwargs)


def tap(arr: np.ndarray, name: str, on_input: Callable[[str, np.ndarray], None]) -> Tap:
    t = np.asarray(arr, np.float32).view(Tap)
    t.name, t.on_input = name, on_input
    return t


class TappedWeights(Mapping[str, np.ndarray]):
    """`base` with the linear weights of `layers` as taps (and `replace` for already-quantized
    weights, which the forward then runs with)."""

    def __init__(
        self,
        base: Mapping[str, np.ndarray],
        layers: set[int],
        on_input: Callable[[str, np.ndarray], None],
        replace: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        self.base, self.layers, self.on_input = base, layers, on_input
        self.replace = replace or {}

    def __getitem__(self, name: str) -> np.ndarray:
        arr = self.replace[name] if name in self.replace else self.base[name]
        if is_linear(name) and layer_of(name) in self.layers:
            return tap(arr, name, self.on_input)
        return arr

    def __iter__(self) -> Iterator[str]:
        return iter(self.base)

    def __len__(self) -> int:
        return len(self.base)


def hessians(
    ck: Checkpoint,
    seqs: Sequence[Sequence[int]],
    layers: set[int],
    weights: Mapping[str, np.ndarray] | None = None,
    replace: Mapping[str, np.ndarray] | None = None,
) -> tuple[dict[str, np.ndarray], int]:
    """H = X.T X (float64) of every linear weight of `layers` over the tokens of `seqs`, with the
    weights in `replace` (the layers quantized so far) in the forward; (by weight name, tokens).
    The forward stops after the last layer asked for."""
    w = weights if weights is not None else ck.weights()
    last = max(layers)
    acc: dict[str, np.ndarray] = {}
    last_kind = "ffn_down"

    last: list[tuple[np.ndarray, np.ndarray]] = []  # q/k/v (gate/up) read one input: one product

    def on_input(name: str, x: np.ndarray) -> None:
        if last and last[0][0] is x:
            h = last[0][1]
        else:
            # one sequence's product in float32 (a few hundred rows), the sum over them in float64
            x2 = np.ascontiguousarray(x.reshape(-1, x.shape[-1]), np.float32)
            h = (x2.T @ x2).astype(np.float64)
            last[:] = [(x, h)]
        acc[name] = acc[name] + h if name in acc else h.copy()
        if layer_of(name) == last and name.split(".")[2] == last_kind:
            raise StopForward

    tw = TappedWeights(w, layers, on_input, replace)
    tokens = 0
    for ids in seqs:
        tokens += len(ids)
        try:
            ck.family.forward(ck.config, tw, list(ids))
        except StopForward:
            pass
    return acc, tokens
