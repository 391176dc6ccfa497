#!/usr/bin/env python3
"""A Genie-layout token loop in Python over onnxruntime, on a Genie bundle's context binaries:

    genie_ref.py BUNDLE_DIR N_TOKENS --ids 1,2,3      prints {"output_ids": [...]}

It runs the EPContext wrappers the exporter (qhx-export --format genie) keeps next to the
context binaries, so the same QNN binaries Genie runs, through ORT's QNN EP. The loop itself
(SMART_MASK host side, written from Genie's public description) is the exporter's
qhx_export.verify.genie_loop, which also calibrates quantized Genie bundles over the float
graphs; genie-source.json gives the graphs, their order, QNN options and fixed-point I/O.
Run with the QNN venv's python (scripts/qnn-libs.sh --python).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "export"))
from qhx_export.verify.genie_loop import GenieLoop, Split  # noqa: E402

__all__ = ["GenieLoop", "Split", "load_bundle"]


def qnn_session(path: str, qnn_opts: dict):
    import onnxruntime as ort

    from qhx_export.compile.htp import qnn_devices

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_provider_for_devices(qnn_devices(), qnn_opts)
    return ort.InferenceSession(path, so)


def load_bundle(d: str) -> GenieLoop:
    """The QNN EP loop over a Genie bundle (its genie-source.json lists the wrappers)."""
    with open(os.path.join(d, "genie-source.json"), encoding="utf-8") as f:
        src = json.load(f)
    variants: dict = {}
    for g in sorted(src["graphs"], key=lambda g: g["name"]):
        sess = qnn_session(os.path.join(d, g["wrapper"]), src["qnn_options"][g["precision"]])
        variants.setdefault(g["ar"], []).append(Split(sess, {k: tuple(v) for k, v in g.get("quant", {}).items()}))
    return GenieLoop(src["params"], src["rope"], variants)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("n_tokens", type=int)
    ap.add_argument("--ids", required=True)
    a = ap.parse_args()
    loop = load_bundle(a.bundle)
    ids = [int(t) for t in a.ids.split(",")]
    print(json.dumps({"input_ids": ids, "output_ids": loop.generate(ids, a.n_tokens)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
