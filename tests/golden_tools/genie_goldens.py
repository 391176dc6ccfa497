#!/usr/bin/env python3
"""Record what Qualcomm's libGenie.so generates on our Genie bundles, as goldens a test can hold
qhx_generate to:

    scripts/goldens.sh genie BUNDLE_DIR... --out tests/goldens/genie
        [--n 16] [--cases short,midword,...]

For each bundle (from scripts/build-genie.sh) and each parity prompt of its family
(tests/goldens/parity/<family>_<case>.json, whose input_ids the HF tokenizer made), it runs
  * libGenie.so (tests/harness/genie_run.py, GenieDialog_tokenQuery, greedy, in a subprocess), fed the
    prompt ids without the leading BOS because Genie prepends the config's bos-token itself;
  * qhx_export.verify.genie_loop's Python loop over the same context binaries (ORT's QNN EP), fed the
    ids with BOS: an independent host implementation, so agreement shows both hosts feed the
    graphs the same way;
and writes <out>/<bundle>.json with both id lists, whether they agree, how far each matches the
HF fp32 gold continuation, and Genie's load/TTFT/tok-s on this machine (the x86 HTP simulator:
not phone speed).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = "short,midword,question,cyrillic,code,cjk_emoji"


def prefix(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundles", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--cases", default=CASES)
    ap.add_argument("--lib-dir", default=os.environ.get("QHX_QNN_LIBS"))
    ap.add_argument("--no-ref", action="store_true", help="skip the Python reference loop")
    a = ap.parse_args()
    from qhx_export.verify import genie_loop
    os.makedirs(a.out, exist_ok=True)
    root = os.path.dirname(os.path.dirname(HERE))
    for b in a.bundles:
        src = json.load(open(os.path.join(b, "genie-source.json"), encoding="utf-8"))
        fam = src.get("model_name", src["family"])  # the parity goldens are named by model
        goldens = [os.path.join(root, "tests/goldens/parity", f"{fam}_{c}.json") for c in a.cases.split(",")]
        cmd = [sys.executable, os.path.join(root, "tests", "harness", "genie_run.py"), os.path.join(b, "genie_config.json"), str(a.n),
               "--lib-dir", a.lib_dir] + [x for g in goldens for x in ("--golden", g)]
        print(f"genie_goldens: {os.path.basename(b)}: libGenie.so", file=sys.stderr, flush=True)
        res = subprocess.run(cmd, stdout=subprocess.PIPE, check=True)
        genie = json.loads(res.stdout)
        ref_loop = None if a.no_ref else genie_loop.load_bundle(b)
        runs = []
        for g, r in zip(goldens, genie["runs"]):
            gd = json.load(open(g, encoding="utf-8"))
            gold = gd["gold_ids"] if isinstance(gd["gold_ids"], list) else json.loads(gd["gold_ids"])
            ent = {"case": gd["case"], "prompt": gd["prompt"], "input_ids": gd["input_ids"],
                   "genie_query_ids": r["input_ids"], "genie_ids": r["output_ids"], "genie_status": r["status"],
                   "genie_ttft_ms": r.get("ttft_ms"), "genie_tok_s": r.get("tok_s"),
                   "genie_vs_hf_gold_prefix": prefix(r["output_ids"], gold)}
            if ref_loop is not None:
                print(f"genie_goldens: {os.path.basename(b)} {gd['case']}: Python reference", file=sys.stderr, flush=True)
                loop = genie_loop.GenieLoop(src["params"], src["rope"], ref_loop.variants)
                ent["ref_ids"] = loop.generate(gd["input_ids"], len(r["output_ids"]) or a.n)
                ent["genie_equals_ref"] = ent["ref_ids"] == r["output_ids"]
            runs.append(ent)
        doc = {
            "how_made": {"script": "tests/golden_tools/genie_goldens.py", "genie": "libGenie.so from onnxruntime-qnn 2.7.0 "
                         "(QAIRT 2.51, x86_64 HTP simulator), GenieDialog_tokenQuery, greedy (top-k 1)",
                         "ref": "python -m qhx_export.verify.genie_loop over the same binaries (ORT QNN EP)",
                         "hf_gold": "tests/goldens/parity/<family>_<case>.json gold_ids (HF transformers fp32)"},
            "bundle": os.path.basename(os.path.normpath(b)), "family": fam, "precision": src["precision"],
            "ar": src["ar"], "ctx": src["ctx"], "splits": src["splits"],
            "weights_sha256": src.get("weights_sha256"), "graphs": [g["name"].rstrip("_") for g in src["graphs"]],  # '_' padding: qhx_export.write.genie.rename_graph
            "n_tokens": a.n, "genie_load_ms": genie["load_ms"], "runs": runs,
        }
        path = os.path.join(a.out, doc["bundle"] + ".json")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, ensure_ascii=False)
            f.write("\n")
        os.replace(path + ".tmp", path)
        agree = [r.get("genie_equals_ref") for r in runs]
        print(f"genie_goldens: wrote {path} (genie == ref: {agree})", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
