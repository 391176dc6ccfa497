"""Graphs in the tensor layout Qualcomm's Genie (libGenie.so, QnnHtp engine) binds, built from the
same decoder layers as the qhx graphs (qhx_export.graphs.decoder.decoder_layer).

One graph per (AR, CL) variant: AR = --ar (prompt) and AR = 1 (token).

  inputs   input_ids            int32 [1, AR]            (embedding Gather in the graph)
           attention_mask       float [1, 1, AR, CL]     0 attend, -1000 masked (Genie's values)
           position_ids_cos/sin float [1, 1, AR, Dh/2]   half-rotation RoPE tables
           past_key_{L}_in      float [n_kv, 1, Dh, CL-AR]   keys transposed
           past_value_{L}_in    float [n_kv, 1, CL-AR, Dh]
  outputs  past_key_{L}_out     float [n_kv, 1, Dh, AR]  this step's keys (after RoPE)
           past_value_{L}_out   float [n_kv, 1, AR, Dh]
           logits               float [1, 1, AR, V]

Mask column j < CL-AR is past slot j, column CL-AR+i the step's token i (SMART_MASK). Masked
scores are replaced by a floor, never added to: Genie leaves never-written past slots
uninitialised, and score + mask of such a slot can saturate fp16 and win the softmax.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from qhx_export.families.base import Config
from qhx_export.graphs.builder import OPSET, Builder
from qhx_export.graphs.decoder import GraphOptions, WeightFn, decoder_layer

MASK_NEG = -1000.0


def io_spec(
    c: Config, ar: int, cl: int
) -> tuple[list[tuple[str, int, list[int]]], list[tuple[str, int, list[int]]]]:
    Dh, nkv = c.head_dim, c.n_kv_heads
    f = TensorProto.FLOAT
    ins = [
        ("input_ids", TensorProto.INT32, [1, ar]),
        ("attention_mask", f, [1, 1, ar, cl]),
        ("position_ids_cos", f, [1, 1, ar, Dh // 2]),
        ("position_ids_sin", f, [1, 1, ar, Dh // 2]),
    ]
    outs = []
    for i in range(c.n_layers):
        ins += [
            (f"past_key_{i}_in", f, [nkv, 1, Dh, cl - ar]),
            (f"past_value_{i}_in", f, [nkv, 1, cl - ar, Dh]),
        ]
        outs += [(f"past_key_{i}_out", f, [nkv, 1, Dh, ar]), (f"past_value_{i}_out", f, [nkv, 1, ar, Dh])]
    outs.append(("logits", f, [1, 1, ar, c.vocab]))
    return ins, outs


def genie_graph(c: Config, w: WeightFn, name: str, ar: int, cl: int, o: GraphOptions) -> onnx.ModelProto:
    """The fp16 graph of one Genie (AR, CL) variant."""
    H, Dh, nkv = c.hidden, c.head_dim, c.n_kv_heads
    past = cl - ar
    b = Builder(native_norm=o.exact_ops)
    table = b.const(np.ascontiguousarray(w("token_embd.weight").astype(np.float32)), "embed_tokens")
    x = b.reshape(b.op("Gather", [table, "input_ids"], axis=0), [ar, H])
    cos_h = b.reshape("position_ids_cos", [ar, 1, Dh // 2])
    sin_h = b.reshape("position_ids_sin", [ar, 1, Dh // 2])
    cos = b.op("Concat", [cos_h, cos_h], axis=-1)  # full rotate-half tables [AR, 1, Dh]
    sin = b.op("Concat", [sin_h, sin_h], axis=-1)
    hidden = b.op("Less", ["attention_mask", b.const(np.float32(MASK_NEG / 2))])  # [1, 1, AR, CL]
    h_past, h_self = b.split(hidden, [past, ar], axis=-1) if past else (None, hidden)
    floor = b.const(np.float32(MASK_NEG))

    def where(h: str | None) -> Any:
        return lambda s: s if h is None else b.op("Where", [h, floor, s])

    for i in range(c.n_layers):
        kp = b.reshape(f"past_key_{i}_in", [nkv, 1, Dh, past])
        vp = b.reshape(f"past_value_{i}_in", [nkv, 1, past, Dh])
        x, k, v = decoder_layer(
            b, c, w, i, x, ar, cos, sin, o, (kp, vp, past) if past else None, where(h_past), where(h_self)
        )
        b.reshape(b.transpose(k, [1, 2, 0]), [nkv, 1, Dh, ar], out=f"past_key_{i}_out")
        b.reshape(b.transpose(v, [1, 0, 2]), [nkv, 1, ar, Dh], out=f"past_value_{i}_out")
    x = b.rmsnorm(x, w("output_norm.weight"), c.rms_eps, o.prescale, mixed=False)
    head = w("token_embd.weight") if c.tied else w("output.weight")
    b.reshape(b.linear(x, head), [1, 1, ar, c.vocab], out="logits")
    ins, outs = io_spec(c, ar, cl)
    graph = helper.make_graph(
        b.nodes,
        name,
        [helper.make_tensor_value_info(n, t, d) for n, t, d in ins],
        [helper.make_tensor_value_info(n, t, d) for n, t, d in outs],
        b.inits,
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="qhx-export")
    m.ir_version = 10
    return m
