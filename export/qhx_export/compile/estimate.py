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
        "graphs": {role: _with_ms(row) for role, row in per_graph.items()},
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
    if "decode_ms_per_token" in out:
        out["decode_tok_per_s"] = round(1000 / out["decode_ms_per_token"], 1)
        out["weight_bytes_per_token"] = out["decode_weight_bytes"]
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
    if lm is not None:
        # a context ladder: decode ms/token on each rung (decode@C + lm-head), the main rung last
        rungs = {
            int(role.split("@")[1]): row["us"]
            for role, row in per_graph.items()
            if role.startswith("decode@") and row.get("us") is not None
        }
        if rungs and d is not None:
            top = max(rungs) * 2  # sorts after every rung; replaced by the context below
            rungs[top] = d
            out["ladder_decode_ms_per_token"] = {
                ("ctx" if c == top else str(c)): round((us + lm) / 1000, 3) for c, us in sorted(rungs.items())
            }
    line = summary_line(out, ar)
    if line is not None:
        out["summary"] = line
    return out


def _with_ms(row: dict[str, Any]) -> dict[str, Any]:
    """The row with its times also in ms (what the log and README print)."""
    ms = {k.replace("us", "ms"): round(row[k] / 1000, 3) for k in ("us", "lower_us", "upper_us") if k in row}
    return {**row, **ms}


def ms(us: float) -> str:
    """Microseconds as milliseconds with three significant figures or more (0.00321, 5.23, 812)."""
    v = us / 1000
    return f"{v:.0f}" if v >= 100 else f"{v:.2f}" if v >= 1 else f"{v:.3g}"


def rate(per_s: float) -> str:
    return f"{per_s:,.0f}" if per_s >= 100 else f"{per_s:.1f}"


def graph_line(role: str, row: dict[str, Any]) -> str:
    """One readable line for a graph's estimate: `decode 5.23 ms (4.90-5.61), 8.94 M cycles`."""
    if "us" not in row:
        return f"{role}: no estimate ({row.get('error', 'no row')})"
    text = f"{role} {ms(row['us'])} ms"
    if "lower_us" in row and "upper_us" in row:
        text += f" ({ms(row['lower_us'])}-{ms(row['upper_us'])})"
    if "cycles" in row:
        c = row["cycles"]
        text += f", {c / 1e6:.2f} M cycles" if c >= 1e6 else f", {c:,.0f} cycles"
    return text


def summary_line(est: dict[str, Any], ar: int) -> str | None:
    """The headline figures of `summarize` in one line, or None when decode was not estimated."""
    parts = []
    if "decode_ms_per_token" in est:
        t = est["decode_ms_per_token"]
        parts.append(f"decode {ms(t * 1000)} ms/token ({rate(1000 / t)} tok/s; decode + lm-head)")
    if "prefill_tok_per_s" in est:
        parts.append(f"prefill {rate(est['prefill_tok_per_s'])} tok/s ({ar} rows + lm-head)")
    if "decode_weight_bytes" in est:
        gbs = est.get("implied_GB_per_s")
        parts.append(
            f"{est['decode_weight_bytes'] / 1e6:,.1f} MB of weights per token"
            + (f" ({gbs} GB/s)" if gbs is not None else "")
        )
    if not parts:
        return None
    return ", ".join(parts) + f" [Hextimate soc {ESTIMATE_SOC}, not a phone measurement]"


def _num(key: str) -> float:
    return float(key) if key.isdigit() else float("inf")
