"""ONNX graphs in the tensor layout Qualcomm's Genie (libGenie.so, QnnHtp engine) binds.

One graph = one (AR, CL) variant of the model, or one split of it:

  inputs   input_ids            int32 [1, AR]              (first split; embedding Gather in-graph)
           <split hidden>       float [1, AR, H]           (later splits; same name as the
                                                            previous split's output)
           attention_mask       float [1, 1, AR, CL]       additive: 0 attend, -1000 masked
                                                           (Genie's float values)
           position_ids_cos/sin float [1, 1, AR, Dh/2]     half-rotation RoPE table rows
           past_key_{L}_in      float [n_kv, 1, Dh, CL-AR] keys transposed
           past_value_{L}_in    float [n_kv, 1, CL-AR, Dh]
  outputs  past_key_{L}_out     float [n_kv, 1, Dh, AR]    this step's keys (post-RoPE)
           past_value_{L}_out   float [n_kv, 1, AR, Dh]
           logits               float [1, 1, AR, V]        (last split)
           <split hidden>       float [1, AR, H]           (earlier splits)

The step's own K/V are concatenated after the past inside the graph, so mask column j < CL-AR
is past slot j and column CL-AR+i is the step's token i (Genie's SMART_MASK layout).

Masked scores (mask < -500) are replaced by a floor (-1000 float, -60 quantized: a 16-bit score
tensor cannot span -1000..10), never added to, so garbage in never-written past slots cannot
leak in. Quantized graphs (opts["quant"]) take the mask quantized so that Genie's raw 0 means
-1000 (masked) and raw 65535 means 0 (attend). Every input of a quantized graph also passes
a Mul by 1 so the quantizer puts exactly one QuantizeLinear on it (make_genie.py strips it to
make the graph input itself fixed-point), and every output is made by a Mul by 1 so that the
output's own quantization override holds.

Weights: GGUF-style names ([out, in], HF rotate-half q/k rows), as scripts/real_graphs.py.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

import real_graphs as rg

MASK_NEG = -1000.0  # Genie's float "masked" value (fp16 and fp32 masks)
SPLIT_HIDDEN = "hidden_states_split_{}"  # output of split i, input of split i+1


def io_spec(p: dict, ar: int, cl: int, layers, first: bool, last: bool, split: int) -> tuple[list, list]:
    """([(name, onnx dtype, dims)] inputs, outputs) of one graph."""
    H, Dh, nkv, V = p["hidden"], p["head_dim"], p["n_kv_heads"], p["vocab"]
    f = TensorProto.FLOAT
    ins = [("input_ids", TensorProto.INT32, [1, ar])] if first else [(SPLIT_HIDDEN.format(split - 1), f, [1, ar, H])]
    ins += [("attention_mask", f, [1, 1, ar, cl]), ("position_ids_cos", f, [1, 1, ar, Dh // 2]),
            ("position_ids_sin", f, [1, 1, ar, Dh // 2])]
    outs = []
    for i in layers:
        ins += [(f"past_key_{i}_in", f, [nkv, 1, Dh, cl - ar]), (f"past_value_{i}_in", f, [nkv, 1, cl - ar, Dh])]
        outs += [(f"past_key_{i}_out", f, [nkv, 1, Dh, ar]), (f"past_value_{i}_out", f, [nkv, 1, ar, Dh])]
    outs.append(("logits", f, [1, 1, ar, V]) if last else (SPLIT_HIDDEN.format(split), f, [1, ar, H]))
    return ins, outs


def rope_half(g: rg.G, x: str, cos: str, sin: str, dh: int) -> str:
    """Rotate-half RoPE with half-width tables: [x1, x2] -> [x1 c - x2 s, x2 c + x1 s]."""
    half = g.const(np.array([dh // 2, dh // 2], np.int64))
    a, b = g.name("x1"), g.name("x2")
    g.nodes.append(helper.make_node("Split", [x, half], [a, b], axis=-1, name=g.name("Split")))
    lo = g.op("Sub", [g.op("Mul", [a, cos]), g.op("Mul", [b, sin])])
    hi = g.op("Add", [g.op("Mul", [b, cos]), g.op("Mul", [a, sin])])
    return g.op("Concat", [lo, hi], axis=-1)


def genie_graph(p: dict, w: dict, emb: np.ndarray, name: str, ar: int, cl: int, layers=None,
                first: bool = True, last: bool = True, split: int = 1, opts: dict | None = None):
    """The ONNX model of one Genie graph (see the module docstring)."""
    opts = opts or {}
    quant = bool(opts.get("quant"))
    H, Dh, L = p["hidden"], p["head_dim"], p["n_layers"]
    nh, nkv = p["n_heads"], p["n_kv_heads"]
    grp = nh // nkv
    layers = list(range(L)) if layers is None else list(layers)
    eps, pre = p["rms_eps"], opts.get("prescale", 1.0)
    past = cl - ar
    g = rg.G()
    one = g.const(np.float32(1.0))

    def inp(nm):
        return g.op("Mul", [nm, one]) if quant else nm

    def outp(x, dims, nm):
        # Quantized graphs: a final Mul by 1 gives the output a quantizer of its own (after a
        # Reshape it would inherit the producer's scale/offset instead of the override).
        if not quant:
            return g.shape(x, dims, out=nm)
        return g.op("Mul", [g.shape(x, dims), one], out=nm)

    if first:
        table = g.const(np.ascontiguousarray(emb.astype(np.float32)), "embed_tokens")
        x = g.op("Gather", [table, "input_ids"], axis=0)  # [1, AR, H]
        x = g.shape(x, [ar, H])
    else:
        x = g.shape(inp(SPLIT_HIDDEN.format(split - 1)), [ar, H])
    cos = g.shape(inp("position_ids_cos"), [ar, 1, Dh // 2])
    sin = g.shape(inp("position_ids_sin"), [ar, 1, Dh // 2])
    mask = inp("attention_mask")  # [1, 1, AR, CL] broadcasts over [n_kv, grp, AR, CL]
    # Masked scores are replaced, not added to: Genie leaves never-written past slots
    # uninitialised (seen: keys of 3e35 in a 2-split bundle), and score + mask of such a slot
    # saturates in fp16 and wins the softmax.
    hidden = g.op("Less", [mask, g.const(np.float32(MASK_NEG / 2))])
    floor = g.const(np.float32(opts.get("mask_floor", -60.0) if quant else MASK_NEG))
    scale = g.const(np.float32(Dh ** -0.5))
    for i in layers:
        b = f"blk.{i}."
        n = g.rmsnorm(x, w[b + "attn_norm.weight"], eps, pre)
        q = g.shape(g.linear(n, w[b + "attn_q.weight"], w.get(b + "attn_q.bias")), [ar, nh, Dh])
        k = g.shape(g.linear(n, w[b + "attn_k.weight"], w.get(b + "attn_k.bias")), [ar, nkv, Dh])
        v = g.shape(g.linear(n, w[b + "attn_v.weight"], w.get(b + "attn_v.bias")), [ar, nkv, Dh])
        q = rope_half(g, q, cos, sin, Dh)
        k = rope_half(g, k, cos, sin, Dh)
        kt_new = g.op("Transpose", [k], perm=[1, 2, 0])  # [n_kv, Dh, AR]
        v_new = g.op("Transpose", [v], perm=[1, 0, 2])  # [n_kv, AR, Dh]
        outp(kt_new, [nkv, 1, Dh, ar], f"past_key_{i}_out")
        outp(v_new, [nkv, 1, ar, Dh], f"past_value_{i}_out")
        kt_all = g.op("Concat", [g.shape(inp(f"past_key_{i}_in"), [nkv, Dh, past]), kt_new], axis=2)
        v_all = g.op("Concat", [g.shape(inp(f"past_value_{i}_in"), [nkv, past, Dh]), v_new], axis=1)
        kt_all = g.shape(kt_all, [nkv, 1, Dh, cl])
        v_all = g.shape(v_all, [nkv, 1, cl, Dh])
        qh = g.shape(g.op("Transpose", [q], perm=[1, 0, 2]), [nkv, grp, ar, Dh])
        s = g.op("Mul", [g.op("MatMul", [qh, kt_all]), scale])  # [n_kv, grp, AR, CL]
        s = g.op("Where", [hidden, floor, s])
        pr = g.op("Softmax", [s], axis=-1)
        o = g.shape(g.op("MatMul", [pr, v_all]), [nh, ar, Dh])
        o = g.shape(g.op("Transpose", [o], perm=[1, 0, 2]), [ar, nh * Dh])
        x = g.op("Add", [x, g.linear(o, w[b + "attn_output.weight"])])
        x = g.mlp_residual(x, w, b, eps, pre)
    if last:
        x = g.rmsnorm(x, w["output_norm.weight"], eps, pre)
        head = w.get("output.weight", w.get("token_embd.weight"))
        outp(g.linear(x, head), [1, 1, ar, p["vocab"]], "logits")
    else:
        outp(x, [1, ar, H], SPLIT_HIDDEN.format(split))
    ins, outs = io_spec(p, ar, cl, layers, first, last, split)
    graph = helper.make_graph(g.nodes, name, [helper.make_tensor_value_info(n, t, d) for n, t, d in ins],
                              [helper.make_tensor_value_info(n, t, d) for n, t, d in outs], g.inits)
    return rg.finish(graph)
