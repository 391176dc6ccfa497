"""The decoder graphs of every family (Llama, Qwen2, Qwen3): prefill, decode and lm-head.

Graph I/O is the contract every qhx bundle has (tests/qnn-emu/FORMAT.md; the specs come from
`qhx_export.write.emu.graphs_for`, so a real bundle and an emulator bundle of one shape bind
identically in qhx_generate):

  decode   x [H], cos/sin [Dh], cmask [C] (a 1D additive mask over the cache slots),
           past_{k,v}_i [C, K] -> y [H], new_{k,v}_i [1, K]
  prefill  window: x [P, H], cos/sin [P, Dh], cmask [P, P] -> y [P, H], new_{k,v}_i [P, K]
           past:   + past_{k,v}_i [C, K], cmask [P, C + P]
  verify   as prefill "past" with K rows (speculative decoding: K-1 drafts checked per execute)
  lmhead   hidden [H] -> logits [V]

Design (from the seed bundles; each choice measured there):
* GQA-native attention: q is grouped [n_kv, g, R, Dh] against K [n_kv, 1, Dh, T]; K/V are never
  repeated per query head.
* 1/sqrt(Dh) is folded into the q projection (weights and bias, or Qwen3's q-norm weight), so no
  score-sized multiply runs.
* The cache is fixed at C slots; the step's own K/V never enter it inside the graph: the
  self-score is its own small matmul (q against the new K), concatenated after the cache scores
  before the softmax, and the step's V is applied by a second matmul. No C-row concat of K/V per
  step, and no elementwise q*k reduction that overflows fp16 when |k| is large (Qwen2 |k| ~ 400).
* Quantized graphs replace masked scores by a floor (-60: e^-60 is zero to softmax) instead of
  adding a large negative, which a 16-bit score tensor could not span.
* RMSNorm inputs are multiplied by a power-of-two `prescale` so x^2 stays in fp16 range
  (SmolLM2's residual stream reaches ~22,000).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from qhx_export.families.base import Config
from qhx_export.graphs.builder import OPSET, Builder, value_info

FLOAT_NODES_KEY = "qhx_float_nodes"  # model property: nodes mixed precision keeps in float
WEIGHTS_KEY = "qhx_matmul_weights"  # model property: MatMul weight initializers (axis 1 = output)
FP16_NODES_KEY = "qhx_fp16_nodes"  # model property: MatMuls a quantized graph keeps in fp16
QUANT_MASK_FLOOR = -60.0

WeightFn = Callable[[str], np.ndarray]


@dataclass(frozen=True)
class GraphOptions:
    quantized: bool = False  # QDQ graphs: mask floor, a Mul by 1 on every input
    prescale: float = 1.0  # RMSNorm input scale (a power of two)
    fold_q_scale: bool = True  # 1/sqrt(Dh) into the q projection
    fp16_weights: tuple[str, ...] = ()  # quantized graphs: weight kinds kept fp16 ("attn_v", ...)


def specs(
    c: Config, name: str, ar: int, ctx: int, prefill: str, quantized: bool, verify_rows: int | None = None
) -> dict[str, dict[str, Any]]:
    """Graph I/O specs by role (decode, lmhead, prefill unless prefill == "none", verify with
    `verify_rows`: that many rows over the decode cache)."""
    from qhx_export.write.emu import EmuOptions, graphs_for

    p = {
        "hidden": c.hidden,
        "head_dim": c.head_dim,
        "vocab": c.vocab,
        "n_layers": c.n_layers,
        "n_kv_heads": c.n_kv_heads,
    }
    o = EmuOptions(
        name=name,
        prefill_len=ar,
        ctx=ctx,
        io="ufixed16" if quantized else "f32",
        prefill=prefill,
        kv_layout="pos_major",
        verify_rows=verify_rows,
    )
    return graphs_for(p, o, None)


def _finish(b: Builder, spec: dict[str, Any], props: dict[str, str]) -> onnx.ModelProto:
    graph = helper.make_graph(
        b.nodes,
        spec["name"],
        [value_info(t["name"], t["dims"]) for t in spec["inputs"]],
        [value_info(t["name"], t["dims"]) for t in spec["outputs"]],
        b.inits,
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="qhx-export")
    m.ir_version = 10
    helper.set_model_props(
        m, {**props, WEIGHTS_KEY: json.dumps(b.weights), FP16_NODES_KEY: json.dumps(b.fp16_nodes)}
    )
    return m


def decoder_layer(
    b: Builder,
    c: Config,
    w: WeightFn,
    i: int,
    x: str,
    R: int,
    cos: str,
    sin: str,
    o: GraphOptions,
    past: tuple[str, str, int] | None,
    mask_past: Callable[[str], str],
    mask_self: Callable[[str], str],
) -> tuple[str, str, str]:
    """One pre-norm decoder layer over R rows x [R, H]: (x out, this step's K [R, n_kv, Dh] after
    RoPE, V [R, n_kv, Dh]). `past` = (K^T [n_kv, 1, Dh, C], V [n_kv, 1, C, Dh], C) of the cache;
    cos/sin [R, 1, Dh] (rotate-half, each frequency twice); mask_* turn raw scores into masked ones."""
    Dh, nh, nkv = c.head_dim, c.n_heads, c.n_kv_heads
    g_ = nh // nkv
    qscale = np.float32(1.0 / math.sqrt(Dh)) if o.fold_q_scale else np.float32(1.0)
    p = f"blk.{i}."

    def keep(kind: str) -> bool:
        return o.quantized and kind in o.fp16_weights

    n = b.rmsnorm(x, w(p + "attn_norm.weight"), c.rms_eps, o.prescale)
    qw, qb = w(p + "attn_q.weight"), w(p + "attn_q.bias") if c.qkv_bias else None
    if not c.qk_norm:  # fold the score scale into q (RoPE is linear)
        qw = qw * qscale
        qb = qb * qscale if qb is not None else None
    q = b.reshape(b.linear(n, qw, qb, fp16=keep("attn_q")), [R, nh, Dh])
    k = b.reshape(
        b.linear(
            n, w(p + "attn_k.weight"), w(p + "attn_k.bias") if c.qkv_bias else None, fp16=keep("attn_k")
        ),
        [R, nkv, Dh],
    )
    v = b.reshape(
        b.linear(
            n,
            w(p + "attn_v.weight"),
            w(p + "attn_v.bias") if c.qkv_bias else None,
            fp16=keep("attn_v"),
        ),
        [R, nkv, Dh],
    )
    if c.qk_norm:  # Qwen3: per-head RMSNorm of q and k before RoPE; the q scale goes in its weight
        q = b.rmsnorm(q, w(p + "attn_q_norm.weight") * qscale, c.rms_eps, mixed=False)
        k = b.rmsnorm(k, w(p + "attn_k_norm.weight"), c.rms_eps, mixed=False)
    q = b.rope(q, cos, sin, Dh)
    k = b.rope(k, cos, sin, Dh)
    qg = b.reshape(b.transpose(q, [1, 0, 2]), [nkv, g_, R, Dh])
    k_self = b.reshape(b.transpose(k, [1, 2, 0]), [nkv, 1, Dh, R])
    v_self = b.reshape(b.transpose(v, [1, 0, 2]), [nkv, 1, R, Dh])
    s_self = mask_self(b.op("MatMul", [qg, k_self]))
    if past is not None:
        kp, vp, C = past
        s_past = mask_past(b.op("MatMul", [qg, kp]))
        pr = b.op("Softmax", [b.op("Concat", [s_past, s_self], axis=-1)], axis=-1)
        p_past, p_self = b.split(pr, [C, R], axis=-1)
        o_ = b.op("Add", [b.op("MatMul", [p_past, vp]), b.op("MatMul", [p_self, v_self])])
    else:
        o_ = b.op("MatMul", [b.op("Softmax", [s_self], axis=-1), v_self])
    o_ = b.reshape(b.transpose(b.reshape(o_, [nh, R, Dh]), [1, 0, 2]), [R, c.q_rows])
    x = b.residual(x, b.linear(o_, w(p + "attn_output.weight"), fp16=keep("attn_output")))
    n = b.rmsnorm(x, w(p + "ffn_norm.weight"), c.rms_eps, o.prescale)
    gate = b.linear(n, w(p + "ffn_gate.weight"), fp16=keep("ffn_gate"))
    up = b.linear(n, w(p + "ffn_up.weight"), fp16=keep("ffn_up"))
    act = b.op("Mul", [b.op("Mul", [gate, b.op("Sigmoid", [gate])]), up])
    x = b.residual(x, b.linear(act, w(p + "ffn_down.weight"), fp16=keep("ffn_down")))
    return x, k, v


def layer_graph(c: Config, w: WeightFn, spec: dict[str, Any], o: GraphOptions) -> onnx.ModelProto:
    """A prefill or decode graph for one spec of `specs`."""
    H, Dh, L, nkv = c.hidden, c.head_dim, c.n_layers, c.n_kv_heads
    R, C = spec["seq"], spec["ctx"]
    decode = spec["kind"] == "decode"
    has_past = decode or any(t["name"].startswith("past_") for t in spec["inputs"])
    b = Builder()
    one = b.const(np.float32(1.0))

    def inp(name: str) -> str:
        # A Mul by 1 makes the quantizer put one QuantizeLinear on the input, which the
        # writer turns into fixed-point graph I/O.
        return b.op("Mul", [name, one]) if o.quantized else name

    x = b.reshape(inp("x"), [R, H])
    cos = b.reshape(inp("cos"), [R, 1, Dh])
    sin = b.reshape(inp("sin"), [R, 1, Dh])
    mask_in = inp("cmask")
    if decode:
        m_past, m_self = b.reshape(mask_in, [1, 1, 1, C]), None
    elif has_past:
        mp, ms = b.split(b.reshape(mask_in, [R, C + R]), [C, R], axis=1)
        m_past, m_self = b.reshape(mp, [1, 1, R, C]), b.reshape(ms, [1, 1, R, R])
    else:
        m_past, m_self = None, b.reshape(mask_in, [1, 1, R, R])
    floor = b.const(np.float32(QUANT_MASK_FLOOR)) if o.quantized else None
    neg1 = b.const(np.float32(-1.0))

    def masked(s: str, m: str | None) -> str:
        if m is None:
            return s
        if o.quantized:
            return b.op("Where", [b.op("Less", [m, neg1]), floor, s])
        return b.op("Add", [s, m])

    out_dims = {t["name"]: t["dims"] for t in spec["outputs"]}
    for i in range(L):
        past = None
        if has_past:
            kp = b.reshape(
                b.transpose(b.reshape(inp(f"past_k_{i}"), [C, nkv, Dh]), [1, 2, 0]), [nkv, 1, Dh, C]
            )
            vp = b.reshape(
                b.transpose(b.reshape(inp(f"past_v_{i}"), [C, nkv, Dh]), [1, 0, 2]), [nkv, 1, C, Dh]
            )
            past = (kp, vp, C)
        x, k, v = decoder_layer(
            b, c, w, i, x, R, cos, sin, o, past, lambda s: masked(s, m_past), lambda s: masked(s, m_self)
        )
        for kind, t in (("k", k), ("v", v)):
            nm = f"new_{kind}_{i}"
            if o.quantized:  # a Mul by 1 gives the output a quantizer of its own (a Reshape would
                # share its producer's), so a tied K/V range override holds
                b.op("Mul", [b.reshape(t, out_dims[nm]), one], out=nm)
            else:
                b.reshape(t, out_dims[nm], out=nm)
    layer_float = list(b.float_nodes)  # the final norm (if in-graph) stays quantized: it makes y
    if spec.get("final_norm"):
        x = b.rmsnorm(x, w("output_norm.weight"), c.rms_eps, o.prescale, mixed=False)
    b.reshape(x, out_dims["y"], out="y")
    return _finish(b, spec, {FLOAT_NODES_KEY: json.dumps(layer_float)})


def lmhead_graph(c: Config, w: WeightFn, spec: dict[str, Any], o: GraphOptions) -> onnx.ModelProto:
    """hidden [H] -> (final RMSNorm unless the layer graphs apply it) -> logits [V], on the NPU."""
    b = Builder()
    name_in, name_out = spec["inputs"][0]["name"], spec["outputs"][0]["name"]
    one = b.const(np.float32(1.0))
    # quantized: a Mul by 1 on each side gives the graph I/O one quantizer each (fixed-point I/O)
    x = b.reshape(b.op("Mul", [name_in, one]) if o.quantized else name_in, [1, c.hidden])
    if spec.get("norm", True):
        x = b.rmsnorm(x, w("output_norm.weight"), c.rms_eps, o.prescale, mixed=False)
    head = w("token_embd.weight") if c.tied else w("output.weight")
    y = b.linear(x, head)
    if o.quantized:
        b.op("Mul", [b.reshape(y, [c.vocab]), one], out=name_out)
    else:
        b.reshape(y, [c.vocab], out=name_out)
    return _finish(b, spec, {})


def save(m: onnx.ModelProto, path: str) -> None:
    """Save, with weights as external data past 1.5 GB (protobuf's 2 GB limit)."""
    if _small(m):
        onnx.save_model(m, path)
    else:
        onnx.save_model(
            m,
            path,
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=os.path.basename(path) + ".data",
            size_threshold=1024,
        )


def _small(m: onnx.ModelProto) -> bool:
    return sum(t.ByteSize() for t in m.graph.initializer) < 1_500_000_000
