#!/usr/bin/env python3
"""How much does a real bundle's first token depend on one-LSB changes of its inputs?

Runs the ORT reference loop (qhx_export.verify.loop) on one golden prompt twice: with the RoPE
tables computed in float32 (as qhx and the reference loop do) and in float64 rounded to float32. The
two tables differ by at most one quantization step in a handful of elements. A well-conditioned
bundle gives the same top-5 both times; an ill-conditioned one (SmolLM2 W8A16 with its
residual adds and RMSNorms quantized too, which the exporter no longer does: its residual stream
reaches |x| ~ 22,550, so a 16-bit step there is about 0.7) changes its answer,
which is why qhx and the reference loop can disagree on it without either being wrong. A
third run forces a one-step nudge on every prompt row's cos (fixed-point bundles), so that
bundles whose tables happen to agree are probed too. Also prints the fp32 twin (the same graphs in float on ORT's CPU EP) for scale.

    real_sensitivity.py MANIFEST GOLDEN_JSON     (run with scripts/qnn-libs.sh --python)
"""
import json
import os
import sys

import numpy as np

from qhx_export.verify import loop as rr


def rope_rows_f64(inv, pos0, n):
    a = inv.astype(np.float64)[None, :] * np.arange(pos0, pos0 + n, dtype=np.float64)[:, None]
    a = np.concatenate([a, a], axis=1)
    return np.cos(a).astype(np.float32), np.sin(a).astype(np.float32)


def top5(lg):
    return [(int(i), round(float(lg[i]), 3)) for i in np.argsort(-lg, kind="stable")[:5]]


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    man_path, golden = sys.argv[1], sys.argv[2]
    ids = json.load(open(golden, encoding="utf-8"))["input_ids"]
    man = json.load(open(man_path, encoding="utf-8"))
    loop = rr.load_bundle(man_path)
    g = loop.pre or loop.dec
    n = g.inputs["cos"].dims[0]
    c32, s32 = rr.rope_rows(loop.inv, 0, n)
    c64, s64 = rope_rows_f64(loop.inv, 0, n)
    for name, a, b in (("cos", c32, c64), ("sin", s32, s64)):
        t = g.inputs[name]
        d = t.encode(a).astype(np.int64) - t.encode(b).astype(np.int64)
        print(f"{name}: {int((d != 0).sum())} of {d.size} quantized elements differ (max {int(abs(d).max())} step)")
    loop.run_prompt(ids)
    print(f"reference, f32 RoPE: {top5(loop.logits())}")
    f32_rows = rr.rope_rows
    rr.rope_rows = rope_rows_f64
    loop.reset()
    loop.run_prompt(ids)
    print(f"reference, f64 RoPE: {top5(loop.logits())}")
    rr.rope_rows = f32_rows
    # The same nudge forced on any bundle: one step up in cos[row, 1] of every prompt row.
    rows = min(len(ids), n)
    set_orig = g.set

    def nudged(name, real):
        set_orig(name, real)
        if name == "cos" and g.inputs[name].dtype != "f32":
            t = g.feeds[name].reshape(n, -1)
            t[:rows, 1] = np.minimum(t[:rows, 1].astype(np.int64) + 1, 65535).astype(t.dtype)

    g.set = nudged
    loop.reset()
    loop.run_prompt(ids)
    print(f"reference, cos[p, 1] + 1 step for {rows} rows: {top5(loop.logits())}")
    g.set = set_orig
    twin = rr.load_bundle(man_path, float_twin=True)
    twin.run_prompt(ids)
    print(f"fp32 twin:           {top5(twin.logits())}")
    print(f"({man['model']['name']}, prompt of {len(ids)} ids from {os.path.basename(golden)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
