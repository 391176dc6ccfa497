"""The decoder graphs of every family (Llama, Qwen2, Qwen3, Gemma 3, LFM2): prefill, decode and
lm-head.

Graph I/O is the contract every qhx bundle has (tests/qnn-emu/FORMAT.md; the specs come from
`qhx_export.write.emu.graphs_for`, so a real bundle and an emulator bundle of one shape bind
identically in qhx_generate):

  decode   x [H], cos/sin [Dh], cmask [C] (a 1D additive mask over the cache slots),
           past_{k,v}_i [C, K] -> y [H], new_{k,v}_i [1, K]
           (kv_layout "head_major": every K/V tensor [n_kv, rows, Dh] instead of [rows, K])
  prefill  window: x [P, H], cos/sin [P, Dh], cmask [P, P] -> y [P, H], new_{k,v}_i [P, K]
           past:   + past_{k,v}_i [C, K], cmask [P, C + P]
  verify   as prefill "past" with K rows (speculative decoding: K-1 drafts checked per execute)
  lmhead   hidden [H] -> logits [V]

Design (from the seed bundles; each choice measured there):
* GQA-native attention: K/V are never repeated per query head. Over the cache (decode, verify,
  chunked prefill) the g query heads of a KV head are rows, [n_kv, g*R, Dh] x [n_kv, Dh, C]; the
  window prefill groups q [n_kv, g, R, Dh] against K [n_kv, 1, Dh, R] (each the cheaper in
  Qualcomm's cost model, by 12x for a decode step at C=512; see decoder_layer).
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

Other layer shapes (the model's `layer_types`, as the emulator runs them: tests/qnn-emu/FORMAT.md):
* Gemma 3: norms multiply by 1 + w (added here), a post-norm on the attention and FFN outputs,
  q/k norms, the score scale query_pre_attn_scalar^-0.5 folded into the q-norm weight, a
  gelu(tanh) gate; sliding_attention layers read `cos_local`/`sin_local`/`cmask_local` (the host
  writes the window into the mask; the graph only adds it).
* LFM2 conv layers: B, C, x = in_proj(n); y = C * conv(B * x); out_proj(y). A prefill from an
  empty cache convolves its rows over zero padding and outputs B*x (`conv_bx_<i>`, the rows the
  host seeds the decode state from); decode reads `past_conv_<i>` [H, W] (the last W values of
  B*x, oldest first), outputs `present_conv_<i>` (the window with this token's B*x) and convolves
  it.
* `GraphOptions.io_f16`: every graph tensor fp16 (the LFM2 runner's contract), cast at the edges.
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
from onnx import TensorProto, helper

from qhx_export.families.config import Config
from qhx_export.graphs.builder import OPSET, Builder, value_info

FLOAT_NODES_KEY = "qhx_float_nodes"  # model property: nodes mixed precision keeps in float
WEIGHTS_KEY = "qhx_matmul_weights"  # model property: MatMul weight initializers (axis 1 = output)
WEIGHT_SOURCES_KEY = "qhx_weight_sources"  # model property: weight initializer -> checkpoint tensor
FP16_NODES_KEY = "qhx_fp16_nodes"  # model property: MatMuls a quantized graph keeps in fp16
QUANT_MASK_FLOOR = -60.0

WeightFn = Callable[[str], np.ndarray]


@dataclass(frozen=True)
class GraphOptions:
    quantized: bool = False  # QDQ graphs: mask floor, a Mul by 1 on every input
    prescale: float = 1.0  # RMSNorm input scale (a power of two)
    fold_q_scale: bool = True  # 1/sqrt(Dh) into the q projection
    fp16_weights: tuple[str, ...] = ()  # quantized graphs: weight kinds kept fp16 ("attn_v", ...)
    io_f16: bool = False  # fp16 graph I/O (float graphs only)
    # Post-normed families (Gemma 3): the residual stream is carried times this power of two
    # (post-norm weights and the host embedding scaled by it; the norms reading the stream take
    # eps * s^2), so a stream past fp16's 65504 (Gemma-3-270M: 104,000) fits
    resid_scale: float = 1.0
    qk_prescale: float = 1.0  # q/k norm input scale (Gemma-3-270M's q reaches ~470: q^2 > 65504)
    # Float graphs: SiLU through Tanh, softmax written out, RMSNorm as QNN's RmsNorm (each closer
    # to exact fp16 on the HTP than the single op; see silu, softmax, Builder.rmsnorm)
    exact_ops: bool = True


def specs(
    c: Config,
    name: str,
    ar: int,
    ctx: int,
    prefill: str,
    quantized: bool,
    verify_rows: int | None = None,
    io_f16: bool = False,
    kv_layout: str = "pos_major",
) -> dict[str, dict[str, Any]]:
    """Graph I/O specs by role (decode, lmhead, prefill unless prefill == "none", verify with
    `verify_rows`: that many rows over the decode cache); K/V tensors in `kv_layout`."""
    from qhx_export.write.emu import EmuOptions, graphs_for

    p = {
        "hidden": c.hidden,
        "head_dim": c.head_dim,
        "vocab": c.vocab,
        "n_layers": c.n_layers,
        "n_kv_heads": c.n_kv_heads,
        "layer_types": list(c.types),
        "conv_width": c.conv_width or 3,
    }
    o = EmuOptions(
        name=name,
        prefill_len=ar,
        ctx=ctx,
        io="ufixed16" if quantized else ("f16" if io_f16 else "f32"),
        prefill=prefill,
        kv_layout=kv_layout,
        verify_rows=verify_rows,
    )
    out = graphs_for(p, o, None)
    if quantized:
        # The quantizer picks a quantized graph's I/O types (the emulator's f16 lm-head I/O
        # convention does not apply): its float graph keeps float32 I/O for calibration.
        for spec in out.values():
            for t in spec["inputs"] + spec["outputs"]:
                if t.get("dtype") == "f16":
                    t["dtype"] = "f32"
    return out


def _elem(t: dict[str, Any]) -> int:
    return TensorProto.FLOAT16 if t.get("dtype") == "f16" else TensorProto.FLOAT


def _finish(b: Builder, spec: dict[str, Any], props: dict[str, str]) -> onnx.ModelProto:
    graph = helper.make_graph(
        b.nodes,
        spec["name"],
        [value_info(t["name"], t["dims"], _elem(t)) for t in spec["inputs"]],
        [value_info(t["name"], t["dims"], _elem(t)) for t in spec["outputs"]],
        b.inits,
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="qhx-export")
    m.ir_version = 10
    helper.set_model_props(
        m,
        {
            **props,
            WEIGHTS_KEY: json.dumps(b.weights),
            FP16_NODES_KEY: json.dumps(b.fp16_nodes),
            WEIGHT_SOURCES_KEY: json.dumps(b.weight_sources),
        },
    )
    return m


def norm_weight(c: Config, w: WeightFn, name: str) -> np.ndarray:
    """A norm's multiplier: the stored weight plus the family's offset (Gemma: 1 + w)."""
    arr = np.asarray(w(name), np.float32)
    off = c.norm_offset_of(name)
    return (arr + np.float32(off)).astype(np.float32) if off else arr


def stream_eps(c: Config, o: GraphOptions) -> float:
    """eps of a norm reading the residual stream, which is carried times o.resid_scale."""
    return float(c.rms_eps * o.resid_scale * o.resid_scale)


def gelu_tanh(b: Builder, x: str) -> str:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); an fp16 overflow of x^3 saturates tanh to
    +-1, the function's own limit."""
    x3 = b.op("Mul", [b.op("Mul", [x, x]), x])
    inner = b.op("Add", [x, b.op("Mul", [x3, b.const(np.float32(0.044715))])])
    t = b.op("Tanh", [b.op("Mul", [inner, b.const(np.float32(math.sqrt(2.0 / math.pi)))])])
    half = b.op("Mul", [x, b.const(np.float32(0.5))])
    return b.op("Mul", [half, b.op("Add", [t, b.const(np.float32(1.0))])])


EXP_FLOOR = -64.0  # softmax's x - max floor: e^-64 rounds to 0 in f16, the HTP's Exp is exact there


def silu(b: Builder, x: str, single_op: bool) -> str:
    """x * sigmoid(x). Float graphs write it as h * (1 + tanh(h)), h = x / 2: the HTP's fp16
    Sigmoid after a MatMul is off by up to 0.0037 (15 f16 steps at 0.5; a Sigmoid on a graph
    input is not), which the gate multiplies into the FFN (LFM2's hidden 5x off the fp16 floor);
    its Tanh is within an f16 step. `single_op` (QDQ graphs: one table lookup) keeps Sigmoid."""
    if single_op:
        return b.op("Mul", [x, b.op("Sigmoid", [x])])
    h = b.op("Mul", [x, b.const(np.float32(0.5))])
    return b.op("Mul", [h, b.op("Add", [b.op("Tanh", [h]), b.const(np.float32(1.0))])])


def softmax(b: Builder, x: str, single_op: bool) -> str:
    """Softmax over the last axis. Float graphs write it out, exp(x - max) / sum: the HTP's fp16
    Softmax op is off by up to ~6 f16 steps of its output, the written-out form by ~2. x - max is
    clamped at -64 (e^-64 is 0 in f16): the HTP's fp16 Exp returns garbage below about -88
    (+-131008 at -100 or -1000, Genie's mask value, which zeroed whole rows). `single_op` (QDQ
    graphs) keeps the op."""
    if single_op:
        return b.op("Softmax", [x], axis=-1)
    ax = b.const(np.array([-1], np.int64))
    d = b.op("Sub", [x, b.op("ReduceMax", [x, ax], keepdims=1)])
    e = b.op("Exp", [b.op("Max", [d, b.const(np.float32(EXP_FLOOR))])])
    return b.op("Div", [e, b.op("ReduceSum", [e, ax], keepdims=1)])


def ffn_block(b: Builder, c: Config, w: WeightFn, i: int, x: str, o: GraphOptions) -> str:
    """x + FFN(norm(x)) (Gemma: x + post_ffw_norm(FFN(norm(x))))."""
    p = f"blk.{i}."

    def keep(kind: str) -> bool:
        return o.quantized and kind in o.fp16_weights

    n = b.rmsnorm(x, norm_weight(c, w, p + "ffn_norm.weight"), stream_eps(c, o), o.prescale)
    gate = b.linear(n, w(p + "ffn_gate.weight"), fp16=keep("ffn_gate"), src=p + "ffn_gate.weight")
    up = b.linear(n, w(p + "ffn_up.weight"), fp16=keep("ffn_up"), src=p + "ffn_up.weight")
    g = gelu_tanh(b, gate) if c.act == "gelu_tanh" else silu(b, gate, o.quantized or not o.exact_ops)
    d = b.linear(
        b.op("Mul", [g, up]), w(p + "ffn_down.weight"), fp16=keep("ffn_down"), src=p + "ffn_down.weight"
    )
    if c.post_norms:
        d = b.rmsnorm(d, norm_weight(c, w, p + "post_ffw_norm.weight") * np.float32(o.resid_scale), c.rms_eps)
    return b.residual(x, d)


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
    """One pre-norm attention layer over R rows x [R, H]: (x out, this step's K [R, n_kv, Dh]
    after RoPE, V [R, n_kv, Dh]). `past` = (K^T [n_kv, 1, Dh, C], V [n_kv, 1, C, Dh], C) of the
    cache; cos/sin [R, 1, Dh] (rotate-half, each frequency twice); mask_* turn raw scores into
    masked ones."""
    Dh, nh, nkv = c.head_dim, c.n_heads, c.n_kv_heads
    g_ = nh // nkv
    qscale = np.float32(c.score_scale) if o.fold_q_scale else np.float32(1.0)
    p = f"blk.{i}."

    def keep(kind: str) -> bool:
        return o.quantized and kind in o.fp16_weights

    n = b.rmsnorm(x, norm_weight(c, w, p + "attn_norm.weight"), stream_eps(c, o), o.prescale)
    qw, qb = w(p + "attn_q.weight"), w(p + "attn_q.bias") if c.qkv_bias else None
    if not c.qk_norm:  # fold the score scale into q (RoPE is linear)
        qw = qw * qscale
        qb = qb * qscale if qb is not None else None
    q = b.reshape(b.linear(n, qw, qb, fp16=keep("attn_q"), src=p + "attn_q.weight"), [R, nh, Dh])
    k = b.reshape(
        b.linear(
            n,
            w(p + "attn_k.weight"),
            w(p + "attn_k.bias") if c.qkv_bias else None,
            fp16=keep("attn_k"),
            src=p + "attn_k.weight",
        ),
        [R, nkv, Dh],
    )
    v = b.reshape(
        b.linear(
            n,
            w(p + "attn_v.weight"),
            w(p + "attn_v.bias") if c.qkv_bias else None,
            fp16=keep("attn_v"),
            src=p + "attn_v.weight",
        ),
        [R, nkv, Dh],
    )
    if c.qk_norm:  # per-head RMSNorm of q and k before RoPE; the q scale goes in its weight
        qn = norm_weight(c, w, p + "attn_q_norm.weight") * qscale
        q = b.rmsnorm(q, qn, c.rms_eps, o.qk_prescale, mixed=False, dims=[R, nh, Dh])
        kn = norm_weight(c, w, p + "attn_k_norm.weight")
        k = b.rmsnorm(k, kn, c.rms_eps, o.qk_prescale, mixed=False, dims=[R, nkv, Dh])
    q = b.rope(q, cos, sin, Dh)
    k = b.rope(k, cos, sin, Dh)
    single = o.quantized or not o.exact_ops
    if past is None:  # window prefill: [nkv, g, R, Dh] x [nkv, 1, Dh, R], broadcast over g
        qg = b.reshape(b.transpose(q, [1, 0, 2]), [nkv, g_, R, Dh])
        k_self = b.reshape(b.transpose(k, [1, 2, 0]), [nkv, 1, Dh, R])
        v_self = b.reshape(b.transpose(v, [1, 0, 2]), [nkv, 1, R, Dh])
        o_ = b.op("MatMul", [softmax(b, mask_self(b.op("MatMul", [qg, k_self])), single), v_self])
    else:
        # Reading the cache, the g query heads of a KV head are the rows of one 3-D matmul
        # [nkv, g*R, Dh] x [nkv, Dh, C]; scores go 4-D only to take the masks. Qualcomm's cost
        # model (SmolLM2, soc 72, C=512) puts a decode step at 3.5 ms this way and at 42.7 ms in
        # the window's 4-D form broadcast over g (C=2048: 11.0 against 241.5), a 64-row chunked
        # prefill at 10.2 against 48.4 ms; the window prefill is the cheaper in 4-D (6.0 / 9.3).
        kp, vp, C = past
        gr = g_ * R
        qg = b.reshape(b.transpose(q, [1, 0, 2]), [nkv, gr, Dh])

        def scores(kt: str, t: int, mask: Callable[[str], str]) -> str:
            s4 = mask(b.reshape(b.op("MatMul", [qg, kt]), [nkv, g_, R, t]))
            return b.reshape(s4, [nkv, gr, t])

        s_self = scores(b.transpose(k, [1, 2, 0]), R, mask_self)  # K [nkv, Dh, R]
        s_past = scores(b.reshape(kp, [nkv, Dh, C]), C, mask_past)
        pr = softmax(b, b.op("Concat", [s_past, s_self], axis=-1), single)
        p_past, p_self = b.split(pr, [C, R], axis=-1)
        o_ = b.op(
            "Add",
            [
                b.op("MatMul", [p_past, b.reshape(vp, [nkv, C, Dh])]),
                b.op("MatMul", [p_self, b.transpose(v, [1, 0, 2])]),  # V [nkv, R, Dh]
            ],
        )
    o_ = b.reshape(b.transpose(b.reshape(o_, [nh, R, Dh]), [1, 0, 2]), [R, c.q_rows])
    a = b.linear(o_, w(p + "attn_output.weight"), fp16=keep("attn_output"), src=p + "attn_output.weight")
    if c.post_norms:
        pw = norm_weight(c, w, p + "post_attention_norm.weight") * np.float32(o.resid_scale)
        a = b.rmsnorm(a, pw, c.rms_eps)
    x = b.residual(x, a)
    return ffn_block(b, c, w, i, x, o), k, v


def conv_layer(
    b: Builder, c: Config, w: WeightFn, i: int, x: str, R: int, o: GraphOptions, past: str | None
) -> tuple[str, str]:
    """One LFM2 short-conv layer over R rows: (x out, state out). Without `past` (a prefill from
    an empty cache) the state out is B*x [R, H]; with `past` ([H, W], decode, R = 1) it is the
    window after this token, [H, W]."""
    H, W = c.hidden, c.conv_width or 3
    p = f"blk.{i}.shortconv."
    n = b.rmsnorm(x, norm_weight(c, w, f"blk.{i}.attn_norm.weight"), c.rms_eps, o.prescale)
    gb, gc, xs = b.split(b.linear(n, w(p + "in_proj.weight")), [H, H, H], axis=-1)
    bx = b.op("Mul", [gb, xs])  # [R, H]
    taps = np.asarray(w(p + "conv.weight"), np.float32).reshape(H, W)
    if past is None:
        padded = b.op("Concat", [b.const(np.zeros((W - 1, H), np.float32), "zpad"), bx], axis=0)
        acc = None
        for j in range(W):
            rows = b.op(
                "Slice",
                [
                    padded,
                    b.const(np.array([j], np.int64), "st"),
                    b.const(np.array([j + R], np.int64), "en"),
                    b.const(np.array([0], np.int64), "ax"),
                ],
            )
            term = b.op("Mul", [rows, b.const(np.ascontiguousarray(taps[:, j]), "tap")])
            acc = term if acc is None else b.op("Add", [acc, term])
        assert acc is not None
        conv, state = acc, bx
    else:
        kept = b.op(
            "Slice",
            [
                past,
                b.const(np.array([1], np.int64), "st"),
                b.const(np.array([W], np.int64), "en"),
                b.const(np.array([1], np.int64), "ax"),
            ],
        )
        state = b.op("Concat", [kept, b.reshape(bx, [H, 1])], axis=1)  # [H, W]
        mixed = b.op("Mul", [state, b.const(taps, "taps")])
        conv = b.reshape(b.op("ReduceSum", [mixed, b.const(np.array([1], np.int64))], keepdims=0), [1, H])
    y = b.op("Mul", [gc, conv])
    x = b.residual(x, b.linear(y, w(p + "out_proj.weight")))
    return ffn_block(b, c, w, i, x, o), state


def layer_graph(c: Config, w: WeightFn, spec: dict[str, Any], o: GraphOptions) -> onnx.ModelProto:
    """A prefill or decode graph for one spec of `specs`."""
    H, Dh, L, nkv = c.hidden, c.head_dim, c.n_layers, c.n_kv_heads
    R, C = spec["seq"], spec["ctx"]
    decode = spec["kind"] == "decode"
    head_major = spec.get("kv_layout") == "head_major"  # K/V I/O [n_kv, rows, Dh], else [rows, K]
    in_names = {t["name"] for t in spec["inputs"]}
    has_past = decode or any(n.startswith("past_k_") for n in in_names)
    f16 = {t["name"] for t in spec["inputs"] + spec["outputs"] if t.get("dtype") == "f16"}
    b = Builder(native_norm=o.exact_ops and not o.quantized)
    one = b.const(np.float32(1.0))

    def inp(name: str) -> str:
        if name in f16:
            name = b.op("Cast", [name], to=TensorProto.FLOAT)
        # A Mul by 1 makes the quantizer put one QuantizeLinear on the input, which the
        # writer turns into fixed-point graph I/O.
        return b.op("Mul", [name, one]) if o.quantized else name

    def out(name: str, t: str, dims: list[int]) -> None:
        if name in f16:
            b.op("Cast", [b.reshape(t, dims)], out=name, to=TensorProto.FLOAT16)
        elif o.quantized:  # a Mul by 1 gives the output a quantizer of its own (a Reshape would
            # share its producer's), so a tied K/V range override holds
            b.op("Mul", [b.reshape(t, dims), one], out=name)
        else:
            b.reshape(t, dims, out=name)

    x = b.reshape(inp("x"), [R, H])
    rope = {
        sfx: (b.reshape(inp("cos" + sfx), [R, 1, Dh]), b.reshape(inp("sin" + sfx), [R, 1, Dh]))
        for sfx in ("", "_local")
        if "cos" + sfx in in_names
    }
    floor = b.const(np.float32(QUANT_MASK_FLOOR)) if o.quantized else None
    neg1 = b.const(np.float32(-1.0))

    def masked(s: str, m: str | None) -> str:
        if m is None:
            return s
        if o.quantized:
            return b.op("Where", [b.op("Less", [m, neg1]), floor, s])
        return b.op("Add", [s, m])

    masks: dict[str, tuple[str | None, str | None]] = {}
    for sfx in ("", "_local"):
        if "cmask" + sfx not in in_names:
            continue
        mask_in = inp("cmask" + sfx)
        if decode:
            masks[sfx] = (b.reshape(mask_in, [1, 1, 1, C]), None)
        elif has_past:
            mp, ms = b.split(b.reshape(mask_in, [R, C + R]), [C, R], axis=1)
            masks[sfx] = (b.reshape(mp, [1, 1, R, C]), b.reshape(ms, [1, 1, R, R]))
        else:
            masks[sfx] = (None, b.reshape(mask_in, [1, 1, R, R]))

    out_dims = {t["name"]: t["dims"] for t in spec["outputs"]}
    for i, kind in enumerate(c.types[:L]):
        if kind == "conv":
            past_conv = inp(f"past_conv_{i}") if decode else None
            x, state = conv_layer(b, c, w, i, x, R, o, past_conv)
            nm = f"present_conv_{i}" if decode else f"conv_bx_{i}"
            if nm in out_dims:
                out(nm, state, out_dims[nm])
            continue
        sfx = "_local" if kind == "sliding_attention" else ""
        cos, sin = rope[sfx]
        m_past, m_self = masks[sfx]
        past = None
        if has_past:
            pk, pv = inp(f"past_k_{i}"), inp(f"past_v_{i}")
            if head_major:  # already by head: K^T is one transpose, V one reshape
                kp = b.reshape(b.transpose(pk, [0, 2, 1]), [nkv, 1, Dh, C])
                vp = b.reshape(pv, [nkv, 1, C, Dh])
            else:
                kp = b.reshape(b.transpose(b.reshape(pk, [C, nkv, Dh]), [1, 2, 0]), [nkv, 1, Dh, C])
                vp = b.reshape(b.transpose(b.reshape(pv, [C, nkv, Dh]), [1, 0, 2]), [nkv, 1, C, Dh])
            past = (kp, vp, C)

        def mp_(s: str, m: str | None = m_past) -> str:
            return masked(s, m)

        def ms_(s: str, m: str | None = m_self) -> str:
            return masked(s, m)

        x, k, v = decoder_layer(b, c, w, i, x, R, cos, sin, o, past, mp_, ms_)
        for kv, t in (("k", k), ("v", v)):  # t: [R, n_kv, Dh]
            out(f"new_{kv}_{i}", b.transpose(t, [1, 0, 2]) if head_major else t, out_dims[f"new_{kv}_{i}"])
    layer_float = list(b.float_nodes)  # the final norm (if in-graph) stays quantized: it makes y
    if spec.get("final_norm"):
        x = b.rmsnorm(x, norm_weight(c, w, "output_norm.weight"), stream_eps(c, o), o.prescale, mixed=False)
    out("y", x, out_dims["y"])
    return _finish(b, spec, {FLOAT_NODES_KEY: json.dumps(layer_float)})


def lmhead_graph(c: Config, w: WeightFn, spec: dict[str, Any], o: GraphOptions) -> onnx.ModelProto:
    """hidden [H] -> (final RMSNorm unless the layer graphs apply it) -> logits [V], on the NPU."""
    b = Builder(native_norm=o.exact_ops and not o.quantized)
    t_in, t_out = spec["inputs"][0], spec["outputs"][0]
    name_in, name_out = t_in["name"], t_out["name"]
    one = b.const(np.float32(1.0))
    x = name_in
    if t_in.get("dtype") == "f16":
        x = b.op("Cast", [x], to=TensorProto.FLOAT)
    # quantized: a Mul by 1 on each side gives the graph I/O one quantizer each (fixed-point I/O)
    x = b.reshape(b.op("Mul", [x, one]) if o.quantized else x, [1, c.hidden])
    if spec.get("norm", True):
        x = b.rmsnorm(x, norm_weight(c, w, "output_norm.weight"), stream_eps(c, o), o.prescale, mixed=False)
    head = w("token_embd.weight") if c.tied else w("output.weight")
    y = b.linear(x, head)
    if t_out.get("dtype") == "f16":
        b.op("Cast", [b.reshape(y, [c.vocab])], out=name_out, to=TensorProto.FLOAT16)
    elif o.quantized:
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
