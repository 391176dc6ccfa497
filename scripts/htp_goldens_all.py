#!/usr/bin/env python3
"""Every golden prompt of tiny LFM2 and tiny Gemma 3 (gemma3w) on the x86 HTP simulator, as
export/tests/test_htp_goldens.py runs its CI subset: the HF checkpoint exported with --target htp
--precision fp16 --arch v79 --ar 16, run by qhx_generate teacher-forced on the HF fp32 gold ids,
top-1 agreement by parity.py's f16 tie rule, and the ids compared with the exporter's ORT loop
over the same binaries. Prints one line per prompt; exit 1 when one is under 98 % or the ids
differ. ~1 min a family (two simulator runs per prompt).

    QHX_GENERATE=... QHX_PARITY_BUNDLES=... PYTHONPATH=export \\
        python scripts/htp_goldens_all.py [--family lfm2 --family gemma3w] [--case code] [--out DIR]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
FLOOR = 0.98


def goldens(family: str, cases: list[str]) -> list[dict[str, Any]]:
    out = []
    for p in sorted(glob.glob(os.path.join(ROOT, "tests", "goldens", "parity", f"{family}_*.json"))):
        with open(p, encoding="utf-8") as f:
            g = json.load(f)
        if not cases or g["case"] in cases:
            out.append(g)
    return out


def export(src: str, out: str, ctx: int) -> str:
    """The test's export; returns the manifest path."""
    cmd = [sys.executable, "-m", "qhx_export", src, "-o", out, "--target", "htp", "--precision", "fp16"]
    cmd += ["--arch", "v79", "--ar", "16", "--ctx", str(ctx)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        sys.exit(f"export {src}: exit {r.returncode}: {r.stderr[-600:]}")
    return r.stdout.strip().splitlines()[-1]


def run_sim(binary: str, man: str, g: dict[str, Any]) -> list[int]:
    """qhx_generate teacher-forced on the gold ids: its top-1 ids."""
    from qhx_export.verify.run import qnn_libdir

    lib = qnn_libdir()
    cmd = [binary, man, os.path.join(lib, "libQnnHtp.so"), os.path.join(lib, "libQnnSystem.so")]
    cmd += [os.path.dirname(man), str(len(g["gold_ids"])), g["prompt"], "--ignore-eos", "--json", "-q"]
    cmd += ["--teacher-force", ",".join(map(str, g["gold_ids"]))]
    env = dict(os.environ, LD_LIBRARY_PATH=lib)
    r = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if r.returncode != 0:
        sys.exit(f"qhx_generate exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}")
    doc, _ = json.JSONDecoder().raw_decode(r.stdout)
    if doc["input_ids"] != g["input_ids"]:
        sys.exit(f"{g['case']}: prompt tokenizes to {doc['input_ids']}, golden {g['input_ids']}")
    return [int(t) for t in doc["output_ids"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", action="append", choices=["lfm2", "gemma3w"])
    ap.add_argument("--case", action="append", default=[])
    ap.add_argument("--out", help="export here (default: a temporary directory)")
    a = ap.parse_args()
    import parity
    from qhx_export.verify.loop import load_bundle
    from qhx_export.verify.run import find_qhx_generate

    binary = find_qhx_generate()
    bundles = os.environ.get("QHX_PARITY_BUNDLES") or os.path.join(ROOT, "target", "bundles", "parity")
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for fam in a.family or ["lfm2", "gemma3w"]:
            golds = goldens(fam, a.case)
            ctx = max(len(g["input_ids"]) + len(g["gold_ids"]) for g in golds) + 8
            man = export(os.path.join(bundles, "hf", fam), os.path.join(a.out or tmp, fam), ctx)
            loop = load_bundle(man)
            for g in golds:
                got = run_sim(binary, man, g)
                res = parity.agreement(g, got, "f16")
                same = got == loop.generate(g["input_ids"], len(g["gold_ids"]), g["gold_ids"])
                ok = res["rate"] >= FLOOR and same
                bad += not ok
                print(
                    f"{'ok  ' if ok else 'FAIL'} {fam}/{g['case']}: {res['same'] + res['ties']}/{res['n']}"
                    f"{' (' + str(res['ties']) + ' tie)' if res['ties'] else ''}, ORT loop ids "
                    f"{'equal' if same else 'DIFFER'}; {res['text']}",
                    flush=True,
                )
            del loop
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
