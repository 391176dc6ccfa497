"""ONNX graphs (onnx.helper, numpy weights, no torch) that follow the qnn-emu graph contract
(tests/qnn-emu/FORMAT.md): the same tensor names, ranks, dims and semantics as the emulator
graphs that scripts/make_bundle.py describes, so the unchanged qhx_generate binds them.

Weights come in GGUF-style names (blk.{i}.attn_q.weight, ...; [out, in], HF rotate-half rows).
I/O specs come from make_bundle.graphs_for, so a real bundle and an emulator bundle of the same
shape have identical graph I/O.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 21
# Model property listing the layer graph's residual adds and per-layer RMSNorm nodes, which
# make_real.py --float-residual keeps out of quantization.
FLOAT_NODES_KEY = "qhx_float_nodes"


class G:
    """A tiny ONNX graph builder: every value gets a fresh name."""

    def __init__(self):
        self.nodes, self.inits, self.n = [], [], 0
        self.float_nodes = []  # names of the residual adds and RMSNorms (see float_residual)

    def name(self, hint: str) -> str:
        self.n += 1
        return f"{hint}_{self.n}"

    def const(self, arr, hint="c") -> str:
        nm = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(arr), nm))
        return nm

    def op(self, op: str, inputs, hint=None, out=None, **attrs) -> str:
        o = out or self.name(hint or op.lower())
        self.nodes.append(helper.make_node(op, list(inputs), [o], name=self.name(op), **attrs))
        return o

    def shape(self, x, dims, out=None):
        return self.op("Reshape", [x, self.const(np.array(dims, np.int64), "shape")], out=out)

    def rmsnorm(self, x, w, eps, prescale=1.0):
        k = len(self.nodes)
        y = self._rmsnorm(x, w, eps, prescale)
        self.float_nodes += [n.name for n in self.nodes[k:]]
        return y

    def residual(self, x, delta):
        y = self.op("Add", [x, delta])
        self.float_nodes.append(self.nodes[-1].name)
        return y

    def _rmsnorm(self, x, w, eps, prescale):
        # x / sqrt(mean(x^2) + eps) * w, with x scaled by `prescale` first so that x^2 stays in
        # fp16 range on the HTP (SmolLM2's residual stream carries outliers near 22,000).
        xs = self.op("Mul", [x, self.const(np.float32(prescale))]) if prescale != 1.0 else x
        ms = self.op("ReduceMean", [self.op("Mul", [xs, xs]), self.const(np.array([-1], np.int64))], keepdims=1)
        den = self.op("Sqrt", [self.op("Add", [ms, self.const(np.float32(eps * prescale * prescale))])])
        return self.op("Mul", [self.op("Div", [xs, den]), self.const(w.astype(np.float32), "norm_w")])

    def linear(self, x, w, b=None):
        y = self.op("MatMul", [x, self.const(np.ascontiguousarray(w.T.astype(np.float32)), "w")])
        return self.op("Add", [y, self.const(b.astype(np.float32), "b")]) if b is not None else y

    def mlp_residual(self, x, w, b, eps, prescale=1.0):
        """x + down(silu(gate(n)) * up(n)) with n = ffn_norm(x): a layer's second half."""
        n = self.rmsnorm(x, w[b + "ffn_norm.weight"], eps, prescale)
        gate = self.linear(n, w[b + "ffn_gate.weight"])
        up = self.linear(n, w[b + "ffn_up.weight"])
        act = self.op("Mul", [self.op("Mul", [gate, self.op("Sigmoid", [gate])]), up])
        return self.residual(x, self.linear(act, w[b + "ffn_down.weight"]))

    def rope(self, x, cos, sin, dh):
        # rotate-half: x*cos + [-x2, x1]*sin; cos/sin broadcast over heads ([R, 1, Dh]).
        half = self.const(np.array([dh // 2, dh // 2], np.int64))
        a = self.name("x1")
        b = self.name("x2")
        self.nodes.append(helper.make_node("Split", [x, half], [a, b], axis=-1, name=self.name("Split")))
        rot = self.op("Concat", [self.op("Neg", [b]), a], axis=-1)
        return self.op("Add", [self.op("Mul", [x, cos]), self.op("Mul", [rot, sin])])


def vi(t: dict):
    return helper.make_tensor_value_info(t["name"], TensorProto.FLOAT, t["dims"])


def layer_graph(p: dict, w: dict, spec: dict, opts: dict) -> onnx.ModelProto:
    """A prefill or decode graph for `spec` (one entry of make_bundle.graphs_for).
    opts: prescale (rmsnorm input scale), mask_floor (quantized graphs: hidden slots score
    this value instead of score + mask; a 16-bit score tensor cannot span -30000..10)."""
    H, Dh, L = p["hidden"], p["head_dim"], p["n_layers"]
    nh, nkv = p["n_heads"], p["n_kv_heads"]
    g_ = nh // nkv
    K, Q = nkv * Dh, nh * Dh
    R = spec["seq"]
    C = spec["ctx"]
    head_major = spec.get("kv_layout") == "head_major"
    has_past = any(t["name"].startswith("past_") for t in spec["inputs"])
    T = (C if has_past else 0) + R
    eps, pre = p["rms_eps"], opts.get("prescale", 1.0)
    g = G()
    one = g.const(np.float32(1.0))

    def inp(name):
        # Quantized graphs: a Mul by 1 makes the quantizer put a QuantizeLinear right on the
        # input (it leaves a bare Reshape/Concat in float), which make_real turns into uint16 I/O.
        return g.op("Mul", [name, one]) if floor is not None else name

    floor = opts.get("mask_floor")
    x = g.shape(inp("x"), [R, H])
    cos = g.shape(inp("cos"), [R, 1, Dh])
    sin = g.shape(inp("sin"), [R, 1, Dh])
    if spec["kind"] == "decode":
        mask = g.op("Concat", [inp("cmask"), g.const(np.zeros(1, np.float32))], axis=0)
    else:
        mask = inp("cmask")
    mask = g.shape(mask, [1, 1, R, T])
    if floor is not None:
        # Hidden slots get a fixed score instead of score + mask: what a never-written cache
        # row scores against the query does not matter then.
        hidden = g.op("Less", [mask, g.const(np.float32(-1.0))])
        floor = g.const(np.float32(floor))
    scale = g.const(np.float32(Dh ** -0.5))
    out_dims = {t["name"]: t["dims"] for t in spec["outputs"]}
    for i in range(L):
        b = f"blk.{i}."
        n = g.rmsnorm(x, w[b + "attn_norm.weight"], eps, pre)
        q = g.shape(g.linear(n, w[b + "attn_q.weight"], w.get(b + "attn_q.bias")), [R, nh, Dh])
        k = g.shape(g.linear(n, w[b + "attn_k.weight"], w.get(b + "attn_k.bias")), [R, nkv, Dh])
        v = g.shape(g.linear(n, w[b + "attn_v.weight"], w.get(b + "attn_v.bias")), [R, nkv, Dh])
        q = g.rope(q, cos, sin, Dh)
        k = g.rope(k, cos, sin, Dh)
        kh = g.op("Transpose", [k], perm=[1, 0, 2])  # [nkv, R, Dh]
        vh = g.op("Transpose", [v], perm=[1, 0, 2])
        for kind, src_pm, src_hm in (("k", k, kh), ("v", v, vh)):
            nm = f"new_{kind}_{i}"
            if head_major:
                g.op("Identity", [src_hm], out=nm)
            else:
                g.shape(src_pm, out_dims[nm], out=nm)
        if has_past:
            def past(nm):
                if head_major:
                    return inp(nm)
                return g.op("Transpose", [g.shape(inp(nm), [C, nkv, Dh])], perm=[1, 0, 2])
            kall = g.op("Concat", [past(f"past_k_{i}"), kh], axis=1)
            vall = g.op("Concat", [past(f"past_v_{i}"), vh], axis=1)
        else:
            kall, vall = kh, vh
        kt = g.shape(g.op("Transpose", [kall], perm=[0, 2, 1]), [nkv, 1, Dh, T])
        vall = g.shape(vall, [nkv, 1, T, Dh])
        qh = g.shape(g.op("Transpose", [q], perm=[1, 0, 2]), [nkv, g_, R, Dh])
        s = g.op("Mul", [g.op("MatMul", [qh, kt]), scale])
        s = g.op("Where", [hidden, floor, s]) if floor is not None else g.op("Add", [s, mask])
        pr = g.op("Softmax", [s], axis=-1)
        o = g.shape(g.op("MatMul", [pr, vall]), [nh, R, Dh])
        o = g.shape(g.op("Transpose", [o], perm=[1, 0, 2]), [R, Q])
        x = g.residual(x, g.linear(o, w[b + "attn_output.weight"]))
        x = g.mlp_residual(x, w, b, eps, pre)
    layer_float = list(g.float_nodes)  # the final norm stays quantized: it makes output y
    if spec.get("final_norm"):
        x = g.rmsnorm(x, w["output_norm.weight"], eps, pre)
    g.shape(x, out_dims["y"], out="y")
    graph = helper.make_graph(g.nodes, spec["name"], [vi(t) for t in spec["inputs"]],
                              [vi(t) for t in spec["outputs"]], g.inits)
    m = finish(graph)
    helper.set_model_props(m, {FLOAT_NODES_KEY: json.dumps(layer_float)})
    return m


def lmhead_graph(p: dict, w: dict, spec: dict, opts: dict) -> onnx.ModelProto:
    H, V = p["hidden"], p["vocab"]
    g = G()
    x = g.shape(spec["inputs"][0]["name"], [1, H])
    if spec.get("norm", True):
        x = g.rmsnorm(x, w["output_norm.weight"], p["rms_eps"], opts.get("prescale", 1.0))
    head = w.get("output.weight", w.get("token_embd.weight"))
    g.shape(g.linear(x, head), [V], out=spec["outputs"][0]["name"])
    graph = helper.make_graph(g.nodes, spec["name"], [vi(t) for t in spec["inputs"]],
                              [vi(t) for t in spec["outputs"]], g.inits)
    return finish(graph)


def finish(graph) -> onnx.ModelProto:
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="qhx-make_real")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m
