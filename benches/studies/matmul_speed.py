#!/usr/bin/env python3
"""Hextimate (soc 72) of one MatMul in each weight form the exporter can write
(scripts/export-matmul-speed.sh runs this; issue 30's speed study).

    python3 -m studies.matmul_speed OUT_DIR [--shapes KxN,...] [--rows 1,128] [--forms f,...] [--json]

A graph is uint16 activations in (fixed point, as the bundles' graph I/O), DequantizeLinear,
MatMul with the weight in one form, QuantizeLinear to uint16 out; `+island` variants add what
surrounds a decode MatMul in a mixed graph: an fp16 residual Add on the output (the QDQ output is
dequantized and added to a float input in fp16). Forms:

  fp16         float weights (enable_htp_fp16_precision), float I/O
  int8         int8, one scale per output column (DequantizeLinear axis 1)
  int4         int4, one scale per output column
  lpbq32/64/128  int4 in blocks of B input rows, 4-bit multipliers of a per-channel scale

Prints a markdown table and OUT_DIR/matmul-speed.json: µs (lower-upper), the weight bytes and
the GB/s they imply. The estimates are Qualcomm's cost model, never phone measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

SHAPES = [(2048, 2048), (2048, 512), (2048, 8192), (8192, 2048)]
FORMS = ["fp16", "int8", "int4", "lpbq32", "lpbq64", "lpbq128"]
ACT_SCALE = 8.0 / 65535.0  # uint16 activations over [-4, 4)
ACT_ZP = 32768


def log(msg: str) -> None:
    print(f"matmul-speed: {msg}", file=sys.stderr, flush=True)


def weight_bytes(form: str, K: int, N: int) -> int:
    if form == "fp16":
        return 2 * K * N
    if form == "int8":
        return K * N + 4 * N
    if form == "int4":
        return K * N // 2 + 4 * N
    B = int(form.removeprefix("lpbq"))
    return K * N // 2 + (K // B) * N // 2 + 4 * N


ISLANDS = {
    "": "the MatMul alone",
    "add": "+ an fp16 residual Add (dequantized output + float input, in fp16)",
    "dq": "+ a dequantized float output (fp16 inside), no Add",
    "flag": "the MatMul alone, compiled with fp16 precision enabled (a mixed graph's flag)",
    "qadd": "+ a uint16 residual Add (quantized, no fp16)",
}


def graph(form: str, M: int, K: int, N: int, island: str, path: str) -> None:
    """Write the one-MatMul graph to `path`."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from qhx_export.quant import lpbq

    rng = np.random.default_rng(K * 31 + N)
    w = (rng.standard_normal((K, N)) * 0.02).astype(np.float32)
    nodes, inits = [], []
    if form == "fp16":
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [M, K])]
        inits.append(numpy_helper.from_array(w, "w"))
        nodes.append(helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"))
        out = "y"
    else:
        inputs = [helper.make_tensor_value_info("x", TensorProto.UINT16, [M, K])]
        inits += [
            numpy_helper.from_array(np.array(ACT_SCALE, np.float32), "sx"),
            numpy_helper.from_array(np.array(ACT_ZP, np.uint16), "zx"),
            numpy_helper.from_array(np.array(1.0 / 65535.0, np.float32), "sy"),
            numpy_helper.from_array(np.array(ACT_ZP, np.uint16), "zy"),
        ]
        nodes.append(
            helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"], name="x_dq")
        )
        if form in ("int8", "int4"):
            qmax = 127 if form == "int8" else 7
            ch = (np.abs(w).max(axis=0) / qmax).astype(np.float32)
            q = np.clip(np.round(w / ch), -qmax - 1, qmax).astype(np.int8)
            if form == "int8":
                inits.append(numpy_helper.from_array(q, "wq"))
                inits.append(numpy_helper.from_array(np.zeros(N, np.int8), "wz"))
            else:
                inits.append(lpbq._int4_tensor("wq", q))
                inits.append(lpbq._int4_tensor("wz", np.zeros(N, np.int8)))
            inits.append(numpy_helper.from_array(ch, "ws"))
            nodes.append(
                helper.make_node(
                    "DequantizeLinear", ["wq", "ws", "wz"], ["wf"], name="w_dq", axis=1
                )
            )
        else:
            B = int(form.removeprefix("lpbq"))
            ci, cn = lpbq.chain("w", lpbq.block_int4(w, B), "wf", B)
            inits += ci
            nodes += cn
        nodes.append(helper.make_node("MatMul", ["xf", "wf"], ["yf"], name="mm"))
        nodes.append(
            helper.make_node("QuantizeLinear", ["yf", "sy", "zy"], ["yq"], name="y_q")
        )
        out = "yq"
    outputs = []
    if island in (
        "add",
        "dq",
    ):  # the fp16 residual add a mixed decode graph puts after attn_output / ffn_down
        if form != "fp16":
            nodes.append(
                helper.make_node(
                    "DequantizeLinear", ["yq", "sy", "zy"], ["yd"], name="y_dq"
                )
            )
            out = "yd"
        if island == "add":
            inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [M, N]))
            nodes.append(helper.make_node("Add", [out, "r"], ["z"], name="resid"))
            out = "z"
        outputs.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, [M, N]))
    elif island == "qadd" and form != "fp16":
        inputs.append(helper.make_tensor_value_info("r", TensorProto.UINT16, [M, N]))
        nodes += [
            helper.make_node(
                "DequantizeLinear", ["yq", "sy", "zy"], ["yd"], name="y_dq"
            ),
            helper.make_node(
                "DequantizeLinear", ["r", "sy", "zy"], ["rd"], name="r_dq"
            ),
            helper.make_node("Add", ["yd", "rd"], ["z"], name="resid"),
            helper.make_node("QuantizeLinear", ["z", "sy", "zy"], ["zq"], name="z_q"),
        ]
        outputs.append(helper.make_tensor_value_info("zq", TensorProto.UINT16, [M, N]))
    else:
        dt = TensorProto.FLOAT if form == "fp16" else TensorProto.UINT16
        outputs.append(helper.make_tensor_value_info(out, dt, [M, N]))
    g = helper.make_graph(nodes, "mm", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.save(m, path)


def mode_of(form: str, island: str) -> str:
    return (
        "fp16"
        if form == "fp16"
        else ("mixed" if island in ("add", "dq", "flag") else "quant")
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="matmul_speed")
    ap.add_argument("out")
    ap.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES))
    ap.add_argument("--rows", default="1,128")
    ap.add_argument("--forms", default=",".join(FORMS))
    ap.add_argument(
        "--islands",
        default="",
        help=f"comma list of variants beside the plain MatMul: {', '.join(k for k in ISLANDS if k)}",
    )
    ap.add_argument(
        "--json",
        action="store_true",
        help="the JSON document on stdout instead of the table",
    )
    a = ap.parse_args(argv)
    from qhx_export.compile.estimate import estimate_graph
    from qhx_export.compile.htp import qnn_version, stdout_to_stderr

    os.makedirs(a.out, exist_ok=True)
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    rows = [int(r) for r in a.rows.split(",")]
    forms = a.forms.split(",")
    results: list[dict[str, Any]] = []
    for K, N in shapes:
        for M in rows:
            for form in forms:
                for island in ["", *[i for i in a.islands.split(",") if i]]:
                    if island not in ISLANDS:
                        ap.error(f"--islands: unknown variant {island!r}")
                    tag = f"{form}{'+' + island if island else ''}_M{M}_{K}x{N}"
                    path = os.path.join(a.out, f"{tag}.onnx")
                    graph(form, M, K, N, island, path)
                    t0 = time.monotonic()
                    with stdout_to_stderr():
                        try:
                            res = estimate_graph(
                                path, mode_of(form, island), a.out, tag
                            )
                        except (
                            Exception
                        ) as e:  # a form QNN refuses is a finding, not a crash
                            res = {"error": str(e).strip().splitlines()[-1][:200]}
                    os.unlink(path)
                    b = weight_bytes(form, K, N)
                    row = {
                        "form": form,
                        "island": island,
                        "M": M,
                        "K": K,
                        "N": N,
                        "weight_bytes": b,
                        **res,
                    }
                    if "us" in res:
                        row["GB_per_s"] = round(b / (res["us"] * 1e-6) / 1e9, 1)
                    results.append(row)
                    log(
                        f"{tag}: {res.get('us', res.get('error'))} us ({time.monotonic() - t0:.1f}s)"
                    )
    doc = {
        "what": "Hextimate (soc 72) of one MatMul per weight form; uint16 activations",
        "qairt": qnn_version(),
        "note": "Qualcomm's cost model for a v81-class HTP, not a phone measurement",
        "variants": ISLANDS,
        "rows": results,
    }
    with open(os.path.join(a.out, "matmul-speed.json"), "w") as f:
        json.dump(doc, f, indent=1)
    if a.json:
        print(json.dumps(doc, indent=1))
        return 0
    print("| K×N | M | form | µs (lower–upper) | weight MB | GB/s |")
    print("|---|---|---|---|---|---|")
    for r in results:
        name = r["form"] + (f" [{r['island']}]" if r["island"] else "")
        est = (
            f"{r['us']:.1f} ({r.get('lower_us', 0):.1f}–{r.get('upper_us', 0):.1f})"
            if "us" in r
            else f"— ({r.get('error', '')})"
        )
        print(
            f"| {r['K']}×{r['N']} | {r['M']} | {name} | {est} | {r['weight_bytes'] / 1e6:.2f} | {r.get('GB_per_s', '—')} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
