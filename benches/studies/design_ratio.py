#!/usr/bin/env python3
"""The seed design against ours on the Llama-3.2-1B per-layer shape, in one run (issue 30;
scripts/export-design-ratio.sh runs this).

    python3 -m studies.design_ratio OUT_DIR [--layers N] [--json] [--ours "EXPORT ARGS"]

A random-weight checkpoint of the shape (tests/fixtures/seed_checkpoint.py, N layers, default 2;
cached) is exported twice with `--estimate-only` (AR 128, C 512, v79, as the seed card):

  seed   W8A16, every layer weight int8, fp16 lm-head (the RunAnywhere seed bundle's design)
  ours   W4A16 with the exporter's defaults (or the options given with --ours)

and Qualcomm's cost model (Hextimate, soc 72, v81-class) prices each graph: µs per layer (the
decode graph over N layers), lm-head µs, ms/token extrapolated to the model's 16 layers, the
GB/s each graph's weight bytes imply, and ours / seed. Calibration runs 64 decode steps only
(the estimate depends on the graph, not on the ranges). Never a phone measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from typing import Any

FULL_LAYERS = 16  # Llama-3.2-1B
COMMON = [
    "--arch",
    "v79",
    "--ar",
    "128",
    "--ctx",
    "512",
    "--estimate-only",
    "--calib-steps",
    "64",
]
DESIGNS = {
    "seed": ["--precision", "w8a16", "--fp16-weights", "none"],
    # the weight method changes the values, not the graph: round-to-nearest prices the same
    "ours": ["--precision", "w4a16", "--quant-method", "rtn"],
}


def log(msg: str) -> None:
    print(f"design-ratio: {msg}", file=sys.stderr, flush=True)


def row(rep: dict[str, Any], layers: int) -> dict[str, Any]:
    est = rep["estimate"]["graphs"]
    b = rep["decode_bytes"]
    d, h = est["decode"]["us"], est["lmhead"]["us"]
    per_layer = d / layers
    return {
        "options": rep["options"],
        "quantization": {
            k: rep.get("quantization", {}).get(k)
            for k in ("weights", "lmhead", "fp16_weights")
        },
        "decode_us": d,
        "decode_range_us": [
            est["decode"].get("lower_us"),
            est["decode"].get("upper_us"),
        ],
        "us_per_layer": round(per_layer, 1),
        "lmhead_us": h,
        "ms_per_token_16_layers": round((FULL_LAYERS * per_layer + h) / 1000, 2),
        "layer_weight_bytes": b["layer_weights"],
        "lmhead_weight_bytes": b["lmhead_weights"],
        "decode_GB_per_s": round(b["layer_weights"] / (d * 1e-6) / 1e9, 1),
        "lmhead_GB_per_s": round(b["lmhead_weights"] / (h * 1e-6) / 1e9, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="design_ratio")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=2, help="layers exported (default 2)")
    ap.add_argument(
        "--ours",
        default="",
        help="qhx-export options of our design instead of the defaults",
    )
    ap.add_argument(
        "--json",
        action="store_true",
        help="the JSON document on stdout instead of the table",
    )
    a = ap.parse_args(argv)
    if a.layers < 1 or a.layers > FULL_LAYERS:
        ap.error(f"--layers {a.layers}: 1 to {FULL_LAYERS}")
    cache = os.environ.get("QHX_CACHE", os.path.expanduser("~/.cache/qhx"))
    ck = os.path.join(cache, "seed", f"llama-3.2-1b-{a.layers}l")
    py = sys.executable
    subprocess.run(
        [
            py,
            "-m",
            "fixtures.seed_checkpoint",
            "llama-3.2-1b",
            ck,
            "--layers",
            str(a.layers),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    os.makedirs(a.out, exist_ok=True)
    designs = dict(DESIGNS)
    if a.ours:
        designs["ours"] = shlex.split(a.ours)
    rows: dict[str, Any] = {}
    for tag, opts in designs.items():
        dst = os.path.join(a.out, tag)
        log(f"{tag}: qhx-export {' '.join(opts + COMMON)}")
        t0 = time.monotonic()
        subprocess.run(
            [py, "-m", "qhx_export", ck, "-o", dst, "--force", *opts, *COMMON],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        with open(os.path.join(dst, "export-report.json"), encoding="utf-8") as f:
            rows[tag] = row(json.load(f), a.layers)
        rows[tag]["export_s"] = round(time.monotonic() - t0, 1)
    s, o = rows["seed"], rows["ours"]
    doc = {
        "shape": f"Llama-3.2-1B per layer (H 2048, FFN 8192, 32/8 heads), {a.layers} layers, AR 128, C 512, v79",
        "estimate": "Hextimate cost model, soc 72 (v81-class); not a phone measurement",
        "designs": rows,
        "ratio": round(s["ms_per_token_16_layers"] / o["ms_per_token_16_layers"], 3),
    }
    with open(os.path.join(a.out, "design-ratio.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    if a.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(f"{doc['shape']}; {doc['estimate']}\n")
    print(
        "| design | µs per layer | head µs | ms/token (16 layers + head) | layer GB/s | head GB/s |"
    )
    print("|---|---|---|---|---|---|")
    for tag, r in rows.items():
        print(
            f"| {tag} | {r['us_per_layer']:,.0f} | {r['lmhead_us']:,.0f} | {r['ms_per_token_16_layers']} "
            f"| {r['decode_GB_per_s']} | {r['lmhead_GB_per_s']} |"
        )
    print(f"\nours / seed: {doc['ratio']}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
