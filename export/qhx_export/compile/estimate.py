"""`--estimate`: Qualcomm's own cost model (Hextimate) for each graph.

Compiling in-session with QNN profiling 'detailed' for soc_model 72 (SA8797, a v81-class HTP;
no htp_arch) makes the HTP backend write a "Performance Estimates" block into ORT's profiling CSV:
"Simulated (Accelerator exec time us)" with lower and upper estimates. It is not produced for
SM8650 / SM8750 / SM8850, so one estimate serves every arch. It is a model, not a measurement:
use it to compare designs, never as a phone figure.
"""

from __future__ import annotations

import gc
import glob
import os
from typing import Any

from qhx_export.compile.htp import ESTIMATE_SOC, qnn_devices

ROW = "Simulated (Accelerator exec time us)"


def parse(text: str) -> dict[str, float] | None:
    """The estimate rows of ORT's QNN profiling CSV (value in column 3, label in the last):
    {"us", "lower_us", "upper_us", "cycles"} or None when there are none."""
    import csv
    import io

    want = {
        ROW: "us",
        "Simulated (Accelerator exec time us (lower estimate))": "lower_us",
        "Simulated (Accelerator exec time us (upper estimate))": "upper_us",
        "Simulated (Accelerator exec cycles)": "cycles",
    }
    out: dict[str, float] = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) >= 4 and row[-1] in want:
            try:
                out[want[row[-1]]] = float(row[2])
            except ValueError:
                continue
    return out if "us" in out else None


def estimate_graph(src: str, mode: str, work: str, tag: str) -> dict[str, Any]:
    """Compile `src` in-session for soc 72 with detailed profiling; the Hextimate row, or
    {"error": ...} when the backend wrote none."""
    import onnxruntime as ort

    csv = os.path.join(work, f"estimate-{tag}.csv")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    opts = {
        "backend_type": "htp",
        "soc_model": str(ESTIMATE_SOC),
        "profiling_level": "detailed",
        "profiling_file_path": csv,
    }
    if mode in ("fp16", "mixed"):
        opts["enable_htp_fp16_precision"] = "1"
    so.add_provider_for_devices(qnn_devices(), opts)
    sess = ort.InferenceSession(src, so)
    del sess
    gc.collect()
    text = ""
    for f in sorted(glob.glob(csv + "*")):
        with open(f, encoding="utf-8", errors="replace") as fh:
            text += fh.read()
    row = parse(text)
    return row if row is not None else {"error": "no Performance Estimates row in the profiling CSV"}


def summarize(
    per_graph: dict[str, dict[str, Any]],
    decode_bytes: dict[str, int],
    ar: int,
    rows: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Decode ms/token (decode + lm-head), prefill tok/s (AR rows per prefill + lm-head), the
    bandwidth the weight bytes imply, and each verify graph's cost in decode steps (`rows`: the
    verify roles' row counts)."""
    out: dict[str, Any] = {
        "soc_model": ESTIMATE_SOC,
        "graphs": per_graph,
        "note": "Hextimate cost model (soc 72, v81-class); not a phone measurement",
    }
    d, lm, pf = (per_graph.get(r, {}).get("us") for r in ("decode", "lmhead", "prefill"))
    if d is not None and lm is not None:
        us = d + lm
        out["decode_ms_per_token"] = round(us / 1000, 3)
        w = decode_bytes["layer_weights"] + decode_bytes["lmhead_weights"]
        out["decode_weight_bytes"] = w
        out["implied_GB_per_s"] = round(w / (us * 1e-6) / 1e9, 1)
    if pf is not None and lm is not None:
        out["prefill_tok_per_s"] = round(ar / ((pf + lm) * 1e-6), 1)
    if d is not None:
        # speculative decoding: a k-row verify over the cache against one decode step (layers
        # only; each read row adds an lm-head execute in both cases)
        ver = {}
        for role, row in per_graph.items():
            if role == "verify" or role.startswith("est_verify_"):
                if row.get("us") is not None:
                    k = rows.get(role) if rows else None
                    ver[str(k) if k is not None else role] = {
                        "us": row["us"],
                        "cost_in_decode_steps": round(row["us"] / d, 3),
                    }
        if ver:
            out["verify_vs_decode"] = dict(sorted(ver.items(), key=lambda kv: _num(kv[0])))
    return out


def _num(key: str) -> float:
    return float(key) if key.isdigit() else float("inf")
