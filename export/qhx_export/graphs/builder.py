"""A small ONNX graph builder over onnx.helper: fresh value names, numpy initializers, and the
few composite pieces every decoder graph uses (RMSNorm, linear, rotate-half RoPE)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from onnx import NodeProto, TensorProto, helper, numpy_helper

OPSET = 21  # QInt4 / QUInt4 weights need opset 21


class Builder:
    """Nodes and initializers of one graph. `float_nodes` collects the names of the nodes that
    mixed precision keeps out of quantization (residual adds and RMSNorms)."""

    def __init__(self, native_norm: bool = False) -> None:
        # float graphs: RMSNorm as one SimplifiedLayerNormalization (QNN's RmsNorm), QDQ graphs
        # keep the elementwise form the quantizer knows
        self.native_norm = native_norm
        self.nodes: list[NodeProto] = []
        self.inits: list[TensorProto] = []
        self.n = 0
        self.float_nodes: list[str] = []
        self.weights: list[str] = []  # MatMul weight initializers ([in, out]): per-channel axis 1
        self.fp16_nodes: list[str] = []  # MatMuls (and bias adds) whose weights stay fp16
        # weight initializer -> the checkpoint tensor it is made from (quant/methods.py solves by it)
        self.weight_sources: dict[str, str] = {}

    def name(self, hint: str) -> str:
        self.n += 1
        return f"{hint}_{self.n}"

    def const(self, arr: Any, hint: str = "c") -> str:
        nm = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(arr), nm))
        return nm

    def op(
        self, op: str, inputs: Sequence[str], hint: str | None = None, out: str | None = None, **attrs: Any
    ) -> str:
        o = out or self.name(hint or op.lower())
        self.nodes.append(helper.make_node(op, list(inputs), [o], name=self.name(op), **attrs))
        return o

    def ops(self, op: str, inputs: Sequence[str], n_out: int, **attrs: Any) -> list[str]:
        outs = [self.name(op.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=self.name(op), **attrs))
        return outs

    def reshape(self, x: str, dims: Sequence[int], out: str | None = None) -> str:
        return self.op("Reshape", [x, self.const(np.array(dims, np.int64), "shape")], out=out)

    def transpose(self, x: str, perm: Sequence[int]) -> str:
        return self.op("Transpose", [x], perm=list(perm))

    def split(self, x: str, sizes: Sequence[int], axis: int) -> list[str]:
        return self.ops("Split", [x, self.const(np.array(sizes, np.int64), "split")], len(sizes), axis=axis)

    # ---- composite pieces ------------------------------------------------------------------------

    def rmsnorm(
        self,
        x: str,
        w: np.ndarray,
        eps: float,
        prescale: float = 1.0,
        mixed: bool = True,
        dims: Sequence[int] | None = None,
    ) -> str:
        """x / sqrt(mean(x^2) + eps) * w over the last axis; `dims`: x's shape when it is not 2-D.
        x is multiplied by `prescale` (a power of two) first so that x^2 stays inside fp16 range on
        the HTP; eps scales with it. The native form is QNN's RmsNorm, which on the HTP is within
        an f16 step of exact where ReduceMean(x*x) and the Div lose ~2.5x that (LFM2's hidden
        state); it takes 2-D input only (3-D with more than one row normalizes wrongly), so other
        shapes go through [-1, D]."""
        k = len(self.nodes)
        xs = self.op("Mul", [x, self.const(np.float32(prescale))]) if prescale != 1.0 else x
        eps_s = float(eps * prescale * prescale)
        if self.native_norm:
            flat = dims is not None and len(dims) != 2
            x2 = self.reshape(xs, [-1, int(w.shape[-1])]) if flat else xs
            wn = self.const(w.astype(np.float32), "norm_w")
            y = self.op("SimplifiedLayerNormalization", [x2, wn], axis=-1, epsilon=eps_s)
            if flat:
                assert dims is not None
                y = self.reshape(y, dims)
        else:
            ms = self.op(
                "ReduceMean", [self.op("Mul", [xs, xs]), self.const(np.array([-1], np.int64))], keepdims=1
            )
            den = self.op("Sqrt", [self.op("Add", [ms, self.const(np.float32(eps_s))])])
            y = self.op("Mul", [self.op("Div", [xs, den]), self.const(w.astype(np.float32), "norm_w")])
        if mixed:
            self.float_nodes += [n.name for n in self.nodes[k:]]
        return y

    def residual(self, x: str, delta: str) -> str:
        y = self.op("Add", [x, delta])
        self.float_nodes.append(self.nodes[-1].name)
        return y

    def linear(
        self,
        x: str,
        w: np.ndarray,
        b: np.ndarray | None = None,
        hint: str = "w",
        fp16: bool = False,
        src: str | None = None,
    ) -> str:
        """x @ w.T (+ b); w is [out, in] (PyTorch order). `fp16`: a quantized graph keeps this
        weight (and the bias add) in float, run in fp16 on the HTP. `src`: the checkpoint tensor
        w is (a multiple of)."""
        wn = self.const(np.ascontiguousarray(w.T.astype(np.float32)), hint)
        k = len(self.nodes)
        if not fp16:
            self.weights.append(wn)
            if src is not None:
                self.weight_sources[wn] = src
        y = self.op("MatMul", [x, wn])
        if b is not None:
            y = self.op("Add", [y, self.const(b.astype(np.float32), "b")])
        if fp16:
            self.fp16_nodes += [n.name for n in self.nodes[k:]]
        return y

    def rope(self, x: str, cos: str, sin: str, dh: int) -> str:
        """Rotate-half RoPE: x*cos + [-x2, x1]*sin (cos/sin broadcast over heads)."""
        a, b = self.split(x, [dh // 2, dh // 2], axis=-1)
        rot = self.op("Concat", [self.op("Neg", [b]), a], axis=-1)
        return self.op("Add", [self.op("Mul", [x, cos]), self.op("Mul", [rot, sin])])


def value_info(name: str, dims: Sequence[int], elem: int = TensorProto.FLOAT) -> Any:
    return helper.make_tensor_value_info(name, elem, list(dims))
