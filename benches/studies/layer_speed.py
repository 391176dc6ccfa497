#!/usr/bin/env python3
"""Hextimate (soc 72) of one exported QDQ graph with its weights rewritten into each weight form
(issue 30's speed study: what the MatMuls cost inside a real decode graph, and what the rest does).

    python3 -m studies.layer_speed GRAPH.qdq.onnx OUT_DIR [--forms as-is,int4,lpbq64,only:2048x8192,...] [--json]

GRAPH is a quantized graph the exporter wrote (its stage cache's quantize/*/graph.qdq.onnx, or
`--keep-onnx`). Every LPBQ or per-channel weight DequantizeLinear feeding a MatMul is dequantized
and re-quantized in the form asked for; `none` removes each such MatMul and its weight, its
quantized output becoming a graph input (so every later op keeps its shapes): what the graph
costs besides its weight MatMuls; `only:KxN` removes all but the MatMuls of that weight shape (`only:@NAME+NAME`: of those node names). The estimates are
Qualcomm's cost model, never phone measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np

FORMS = ["as-is", "int8", "int4", "lpbq32", "lpbq64", "lpbq128", "none", "kv-direct"]


def kv_direct(src: str, dst: str) -> int:
    """`src` with the cache inputs' layout changes (Reshape / Transpose from [C, n_kv * Dh] to the
    attention MatMuls' [n_kv, 1, Dh, C] and [n_kv, 1, C, Dh]) cut away: each MatMul's quantized
    cache operand becomes the graph input. What those per-step transposes of the whole cache
    cost. Returns the inputs rewired."""
    import onnx
    from onnx import helper
    from qhx_export.graphs.decoder import save

    m = onnx.load(src, load_external_data=False)
    g = m.graph
    vinfo = {v.name: v for v in onnx.shape_inference.infer_shapes(m).graph.value_info}
    users: dict[str, list[Any]] = {}
    for n in g.node:
        for i in n.input:
            users.setdefault(i, []).append(n)
    made_by = {o: n for n in g.node for o in n.output}
    cut = []
    for inp in [i.name for i in g.input if i.name.startswith(("past_k_", "past_v_"))]:
        frontier, seen = [inp], set()
        while frontier:
            t = frontier.pop()
            for u in users.get(t, []):
                if u.op_type == "MatMul":
                    dq = made_by[t]
                    cut.append(dq.input[0])
                    frontier = []
                    break
                if u.name not in seen:
                    seen.add(u.name)
                    frontier += list(u.output)
    drop = set()
    inits = {i.name: i for i in g.initializer}
    made_by_type = {}
    for t in cut:
        q = made_by[t]
        drop.add(q.name)
        if (
            len(q.input) > 2 and q.input[2] in inits
        ):  # the quantized type is the zero point's
            made_by_type[t] = inits[q.input[2]].data_type
    keep = [n for n in g.node if n.name not in drop]
    del g.node[:]
    g.node.extend(keep)
    for t in cut:
        dims = [d.dim_value for d in vinfo[t].type.tensor_type.shape.dim]
        g.input.append(
            helper.make_tensor_value_info(
                t, made_by_type.get(t, onnx.TensorProto.UINT16), dims
            )
        )
    # the old cache inputs now feed nothing (ORT drops unused inputs' nodes)
    from onnx.external_data_helper import load_external_data_for_model

    load_external_data_for_model(m, os.path.dirname(os.path.abspath(src)))
    save(m, dst)
    return len(cut)


def log(msg: str) -> None:
    print(f"layer-speed: {msg}", file=sys.stderr, flush=True)


def _weights(m: Any, base: str) -> dict[str, tuple[Any, list[Any], np.ndarray]]:
    """MatMul name -> (the weight's last DequantizeLinear, the nodes making it, float weight [K, N])."""
    from onnx import numpy_helper
    from onnx.external_data_helper import (
        load_external_data_for_tensor,
        uses_external_data,
    )

    g = m.graph
    made_by = {o: n for n in g.node for o in n.output}
    inits = {t.name: t for t in g.initializer}

    def arr(name: str) -> np.ndarray:
        t = inits[name]
        if uses_external_data(t):
            load_external_data_for_tensor(t, base)
        return numpy_helper.to_array(t)

    out = {}
    for n in g.node:
        if n.op_type != "MatMul":
            continue
        dq = made_by.get(n.input[1])
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits:
            continue
        q = arr(dq.input[0]).astype(np.float32)
        scale_src = made_by.get(dq.input[1])
        chain = [dq]
        if scale_src is not None and scale_src.op_type == "DequantizeLinear":  # LPBQ
            k = arr(scale_src.input[0]).astype(np.float32)
            ch = arr(scale_src.input[1]).astype(np.float32)
            B = q.shape[0] // k.shape[0]
            scale = np.repeat(k * ch[None, :], B, axis=0)
            chain.append(scale_src)
        else:
            scale = arr(dq.input[1]).astype(np.float32)[None, :]
        out[n.name] = (dq, chain, q * scale)
    return out


def rewrite(src: str, form: str, dst: str, keep_shape: str | None = None) -> int:
    """Write `src` with every weight MatMul's weight in `form` to `dst`; the count rewritten.
    `keep_shape` ("KxN", with form none): the MatMuls of that weight shape stay as they are."""
    import onnx
    from onnx import helper, numpy_helper
    from qhx_export.graphs.decoder import save
    from qhx_export.quant import lpbq

    m = onnx.load(src, load_external_data=False)
    ws = _weights(m, os.path.dirname(os.path.abspath(src)))
    g = m.graph
    drop = {n.name for _, chain, _ in ws.values() for n in chain}
    new: dict[str, list[Any]] = {}
    inits = []
    by_name = {n.name: n for n in g.node}
    drop_mm: set[str] = set()
    vinfo = {v.name: v for v in onnx.shape_inference.infer_shapes(m).graph.value_info}
    extra_inputs: list[Any] = []
    if keep_shape is not None:
        names = (
            set(keep_shape.removeprefix("@").split("+"))
            if keep_shape.startswith("@")
            else set()
        )
        ws = {
            mm: v
            for mm, v in ws.items()
            if f"{v[2].shape[0]}x{v[2].shape[1]}" != keep_shape and mm not in names
        }
        drop = {n.name for _, chain, _ in ws.values() for n in chain}
    for mm, (dq, _, w) in ws.items():
        N = w.shape[1]
        s = f"{mm}_w"
        if form == "none":
            # the MatMul's quantized output becomes a graph input: its weights are gone and every
            # op after it keeps its shapes
            node = by_name[mm]
            qn = next(
                n
                for n in g.node
                if n.op_type == "QuantizeLinear" and n.input[0] == node.output[0]
            )
            drop_mm.update({mm, qn.name})
            dims = [
                d.dim_value for d in vinfo[node.output[0]].type.tensor_type.shape.dim
            ]
            extra_inputs.append(
                helper.make_tensor_value_info(
                    qn.output[0], onnx.TensorProto.UINT16, dims
                )
            )
            continue
        if form in ("int8", "int4"):
            qmax = 127 if form == "int8" else 7
            ch = (np.abs(w).max(axis=0) / qmax).astype(np.float32)
            ch[ch == 0] = 1.0
            q = np.clip(np.round(w / ch), -qmax - 1, qmax).astype(np.int8)
            if form == "int8":
                inits += [
                    numpy_helper.from_array(q, s + "_q"),
                    numpy_helper.from_array(np.zeros(N, np.int8), s + "_z"),
                ]
            else:
                inits += [
                    lpbq._int4_tensor(s + "_q", q),
                    lpbq._int4_tensor(s + "_z", np.zeros(N, np.int8)),
                ]
            inits.append(numpy_helper.from_array(ch, s + "_s"))
            new[dq.name] = [
                helper.make_node(
                    "DequantizeLinear",
                    [s + "_q", s + "_s", s + "_z"],
                    [dq.output[0]],
                    axis=1,
                )
            ]
            continue
        B = int(form.removeprefix("lpbq"))
        ci, cn = lpbq.chain(s, lpbq.block_int4(w, B), dq.output[0], B)
        inits += ci
        new[dq.name] = cn
    nodes = []
    for n in g.node:
        if n.name in new:
            nodes += new[n.name]
        elif n.name not in drop and n.name not in drop_mm:
            nodes.append(n)
    if form == "none":  # the weight chains go with their MatMuls
        nodes = [n for n in nodes if n.name not in drop]
    del g.node[:]
    g.node.extend(nodes)
    g.input.extend(extra_inputs)
    used = {i for n in g.node for i in n.input}
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep + inits)
    # the kept initializers still point at the source's external data file
    from onnx.external_data_helper import load_external_data_for_model

    load_external_data_for_model(m, os.path.dirname(os.path.abspath(src)))
    save(m, dst)
    return len(ws)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="layer_speed")
    ap.add_argument("graph")
    ap.add_argument("out")
    ap.add_argument("--forms", default=",".join(FORMS))
    ap.add_argument(
        "--mode",
        default="quant",
        choices=("quant", "mixed"),
        help="the graph's QNN mode",
    )
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from qhx_export.compile.estimate import estimate_graph
    from qhx_export.compile.htp import stdout_to_stderr

    os.makedirs(a.out, exist_ok=True)
    rows = []
    for form in a.forms.split(","):
        keep = None
        if form.startswith(
            "only:"
        ):  # every weight MatMul removed but those of one shape
            keep, form = form.removeprefix("only:"), "none"
        elif form not in FORMS:
            ap.error(f"--forms: unknown form {form!r}")
        path = a.graph
        n = 0
        if form == "kv-direct":
            path = os.path.join(a.out, "kv-direct.onnx")
            n = kv_direct(a.graph, path)
        elif form != "as-is":
            path = os.path.join(a.out, f"{form}.onnx")
            n = rewrite(a.graph, form, path, keep)
        if keep:
            form = f"only {keep}"
        with stdout_to_stderr():
            try:
                res = estimate_graph(path, a.mode, a.out, form)
            except Exception as e:
                res = {"error": str(e).strip().splitlines()[-1][:200]}
        rows.append({"form": form, "weights_rewritten": n, **res})
        log(f"{form}: {res.get('us', res.get('error'))} us ({n} weights)")
    doc = {
        "graph": a.graph,
        "note": "Hextimate (soc 72), not a phone measurement",
        "rows": rows,
    }
    with open(os.path.join(a.out, "layer-speed.json"), "w") as f:
        json.dump(doc, f, indent=1)
    if a.json:
        print(json.dumps(doc, indent=1))
    else:
        print("| weights | µs (lower–upper) |\n|---|---|")
        for r in rows:
            est = (
                f"{r['us']:.0f} ({r.get('lower_us', 0):.0f}–{r.get('upper_us', 0):.0f})"
                if "us" in r
                else r.get("error")
            )
            print(f"| {r['form']} | {est} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
