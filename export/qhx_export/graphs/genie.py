"""Graphs in the tensor layout Qualcomm's Genie (libGenie.so, QnnHtp engine) binds, built from the
same decoder layers as the qhx graphs (qhx_export.graphs.decoder.decoder_layer).

One graph per (AR, CL) variant and split: AR = --ar (prompt) and AR = 1 (token); with
--genie-splits N each variant is N graphs over consecutive layers (the last with the head).

  inputs   input_ids            int32 [1, AR]            (first split; embedding Gather in the graph)
           hidden_states_split_{s-1} float [1, AR, H]   (later splits: the previous split's output)
           attention_mask       float [1, 1, AR, CL]     0 attend, -1000 masked (Genie's values)
           position_ids_cos/sin float [1, 1, AR, Dh/2]   half-rotation RoPE tables
           past_key_{L}_in      float [n_kv, 1, Dh, CL-AR]   keys transposed
           past_value_{L}_in    float [n_kv, 1, CL-AR, Dh]
  outputs  past_key_{L}_out     float [n_kv, 1, Dh, AR]  this step's keys (after RoPE)
           past_value_{L}_out   float [n_kv, 1, AR, Dh]
           logits               float [1, 1, AR, V]      (last split)
           hidden_states_split_{s} float [1, AR, H]     (earlier splits)

Mask column j < CL-AR is past slot j, column CL-AR+i the step's token i (SMART_MASK). Masked
scores are replaced by a floor, never added to: Genie leaves never-written past slots
uninitialised, and score + mask of such a slot can saturate fp16 and win the softmax.

Quantized graphs (`GraphOptions.quantized`, the float graph a QDQ export calibrates and
quantizes): every float input passes a Mul by 1 and every output is made by one, so the
quantizer puts one QuantizeLinear / DequantizeLinear of its own on each graph tensor (the writer
turns them into fixed-point graph I/O); the masked floor is -60, which a 16-bit score can span.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from qhx_export.families.config import Config
from qhx_export.graphs.builder import OPSET, Builder
from qhx_export.graphs.decoder import (
    FLOAT_NODES_KEY,
    FP16_NODES_KEY,
    QUANT_MASK_FLOOR,
    WEIGHT_SOURCES_KEY,
    WEIGHTS_KEY,
    GraphOptions,
    WeightFn,
    decoder_layer,
)

MASK_NEG = -1000.0
SPLIT_HIDDEN = "hidden_states_split_{}"  # output of split s, input of split s + 1

Spec = list[tuple[str, int, list[int]]]


def split_layers(n_layers: int, splits: int) -> list[list[int]]:
    """Consecutive layer ranges of `splits` graphs (as even as rounding gives)."""
    bounds = [round(n_layers * k / splits) for k in range(splits + 1)]
    return [list(range(bounds[s], bounds[s + 1])) for s in range(splits)]


def io_spec(
    c: Config, ar: int, cl: int, layers: list[int] | None = None, split: int = 1, n_splits: int = 1
) -> tuple[Spec, Spec]:
    """(inputs, outputs) of split `split` (1-based) of `n_splits` over `layers` (default all)."""
    H, Dh, nkv = c.hidden, c.head_dim, c.n_kv_heads
    layers = list(range(c.n_layers)) if layers is None else layers
    f = TensorProto.FLOAT
    first = ("input_ids", TensorProto.INT32, [1, ar])
    ins = [first if split == 1 else (SPLIT_HIDDEN.format(split - 1), f, [1, ar, H])]
    ins += [
        ("attention_mask", f, [1, 1, ar, cl]),
        ("position_ids_cos", f, [1, 1, ar, Dh // 2]),
        ("position_ids_sin", f, [1, 1, ar, Dh // 2]),
    ]
    outs = []
    for i in layers:
        ins += [
            (f"past_key_{i}_in", f, [nkv, 1, Dh, cl - ar]),
            (f"past_value_{i}_in", f, [nkv, 1, cl - ar, Dh]),
        ]
        outs += [(f"past_key_{i}_out", f, [nkv, 1, Dh, ar]), (f"past_value_{i}_out", f, [nkv, 1, ar, Dh])]
    last = split == n_splits
    outs.append(("logits", f, [1, 1, ar, c.vocab]) if last else (SPLIT_HIDDEN.format(split), f, [1, ar, H]))
    return ins, outs


def genie_graph(
    c: Config,
    w: WeightFn,
    name: str,
    ar: int,
    cl: int,
    o: GraphOptions,
    layers: list[int] | None = None,
    split: int = 1,
    n_splits: int = 1,
) -> onnx.ModelProto:
    """The graph of one Genie (AR, CL) variant, or of split `split` of it."""
    H, Dh, nkv = c.hidden, c.head_dim, c.n_kv_heads
    layers = list(range(c.n_layers)) if layers is None else layers
    past = cl - ar
    b = Builder(native_norm=o.exact_ops and not o.quantized)
    one = b.const(np.float32(1.0)) if o.quantized else ""

    def inp(n: str) -> str:
        return b.op("Mul", [n, one]) if o.quantized else n

    def out(x: str, dims: list[int], n: str) -> None:
        if o.quantized:  # a Reshape's output would share its producer's quantizer
            b.op("Mul", [b.reshape(x, dims), one], out=n)
        else:
            b.reshape(x, dims, out=n)

    if split == 1:
        table = b.const(np.ascontiguousarray(w("token_embd.weight").astype(np.float32)), "embed_tokens")
        x = b.reshape(b.op("Gather", [table, "input_ids"], axis=0), [ar, H])
    else:
        x = b.reshape(inp(SPLIT_HIDDEN.format(split - 1)), [ar, H])
    cos_h = b.reshape(inp("position_ids_cos"), [ar, 1, Dh // 2])
    sin_h = b.reshape(inp("position_ids_sin"), [ar, 1, Dh // 2])
    cos = b.op("Concat", [cos_h, cos_h], axis=-1)  # full rotate-half tables [AR, 1, Dh]
    sin = b.op("Concat", [sin_h, sin_h], axis=-1)
    mask = inp("attention_mask")
    hidden = b.op("Less", [mask, b.const(np.float32(MASK_NEG / 2))])  # [1, 1, AR, CL]
    h_past, h_self = b.split(hidden, [past, ar], axis=-1) if past else (None, hidden)
    floor = b.const(np.float32(QUANT_MASK_FLOOR if o.quantized else MASK_NEG))

    def where(h: str | None) -> Any:
        return lambda s: s if h is None else b.op("Where", [h, floor, s])

    for i in layers:
        kp = b.reshape(inp(f"past_key_{i}_in"), [nkv, 1, Dh, past])
        vp = b.reshape(inp(f"past_value_{i}_in"), [nkv, 1, past, Dh])
        x, k, v = decoder_layer(
            b, c, w, i, x, ar, cos, sin, o, (kp, vp, past) if past else None, where(h_past), where(h_self)
        )
        out(b.transpose(k, [1, 2, 0]), [nkv, 1, Dh, ar], f"past_key_{i}_out")
        out(b.transpose(v, [1, 0, 2]), [nkv, 1, ar, Dh], f"past_value_{i}_out")
    layer_float = list(b.float_nodes)  # mixed precision: residual adds and layer norms in fp16
    if split == n_splits:
        x = b.rmsnorm(x, w("output_norm.weight"), c.rms_eps, o.prescale, mixed=False)
        head = w("token_embd.weight") if c.tied else w("output.weight")
        out(b.linear(x, head), [1, 1, ar, c.vocab], "logits")
    else:
        out(x, [1, ar, H], SPLIT_HIDDEN.format(split))
    ins, outs = io_spec(c, ar, cl, layers, split, n_splits)
    graph = helper.make_graph(
        b.nodes,
        name,
        [helper.make_tensor_value_info(n, t, d) for n, t, d in ins],
        [helper.make_tensor_value_info(n, t, d) for n, t, d in outs],
        b.inits,
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="qhx-export")
    m.ir_version = 10
    helper.set_model_props(
        m,
        {
            FLOAT_NODES_KEY: json.dumps(layer_float),
            WEIGHTS_KEY: json.dumps(b.weights),
            FP16_NODES_KEY: json.dumps(b.fp16_nodes),
            WEIGHT_SOURCES_KEY: json.dumps(b.weight_sources),
        },
    )
    return m
