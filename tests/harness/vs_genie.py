#!/usr/bin/env python3
"""The worker behind scripts/vs-genie.sh: libGenie.so and qhx_generate on the same Genie bundles.

Per bundle and parity prompt (tests/goldens/parity/<family>_<case>.json): Genie gets the prompt's
HF token ids without the leading BOS (it prepends the config's bos-token itself) through
GenieDialog_tokenQuery (tests/harness/genie_run.py, a subprocess); qhx_generate gets the prompt text
with the bundle's genie_config.json in the manifest position and --json. A qhx run that fails is
reported with its one error line ("not yet supported" while qhx cannot run Genie bundles), never
replaced by a number.

Per bundle: prompt tokens and generated tokens (sums over the prompts), load ms (Genie: one
GenieDialogConfig_createFromJson + GenieDialog_create; qhx: its stats.load_ms, mean over runs),
TTFT ms and decode tok/s (means over prompts), qhx/Genie ratios (for ms: qhx/Genie, < 1 = qhx
faster; for tok/s: qhx/Genie, > 1 = qhx faster), and whether the greedy ids were equal.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NOTE = ("x86_64 HTP simulator (onnxruntime-qnn 2.7.0, QAIRT 2.51): graphs run on the CPU at "
        "~0.2-1 GMAC/s; simulator speed is not phone speed")


def mean(xs):
    xs = [x for x in xs if x is not None]
    return round(statistics.fmean(xs), 2) if xs else None


def ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def run_genie(bundle, goldens, n, lib):
    cmd = [sys.executable, os.path.join(HERE, "genie_run.py"), os.path.join(bundle, "genie_config.json"), str(n),
           "--lib-dir", lib] + [x for g in goldens for x in ("--golden", g)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        err = [ln for ln in r.stderr.splitlines() if "error" in ln.lower()] or r.stderr.splitlines()[-1:]
        return {"error": err[-1] if err else f"exit {r.returncode}"}
    return json.loads(r.stdout)


def run_qhx(qhx, bundle, lib, n, prompt):
    if not os.path.isfile(qhx):
        return {"error": f"qhx_generate not built ({qhx})"}
    cmd = [qhx, os.path.join(bundle, "genie_config.json"), os.path.join(lib, "libQnnHtp.so"),
           os.path.join(lib, "libQnnSystem.so"), bundle, str(n), prompt, "--json"]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        return {"error": "not yet supported: " + (lines[-1] if lines else f"exit {r.returncode}")}
    try:
        # The QNN backend prints a LIBNATIVE banner on stdout at exit, after the document.
        return json.JSONDecoder().raw_decode(r.stdout.lstrip())[0]
    except json.JSONDecodeError as e:
        return {"error": f"qhx --json output unreadable: {e}"}


def bundle_row(bundle, cases, n, lib, qhx):
    src = json.load(open(os.path.join(bundle, "genie-source.json"), encoding="utf-8"))
    fam = src.get("model_name", src["family"])  # the parity goldens are named by model
    goldens = [os.path.join(ROOT, "tests/goldens/parity", f"{fam}_{c}.json") for c in cases]
    gd = [json.load(open(g, encoding="utf-8")) for g in goldens]
    genie = run_genie(bundle, goldens, n, lib)
    row = {"bundle": os.path.basename(os.path.normpath(bundle)), "precision": src["precision"],
           "splits": src["splits"], "prompts": len(goldens)}
    if "error" in genie:
        row["genie"] = {"error": genie["error"]}
    else:
        runs = genie["runs"]
        row["genie"] = {"prompt_tokens": sum(r["prompt_tokens"] + 1 for r in runs),  # + the BOS Genie adds
                        "generated_tokens": sum(r["generated"] for r in runs), "load_ms": genie["load_ms"],
                        "ttft_ms": mean(r.get("ttft_ms") for r in runs), "tok_s": mean(r.get("tok_s") for r in runs),
                        "ids": [r["output_ids"] for r in runs]}
    q = [run_qhx(qhx, bundle, lib, n, g["prompt"]) for g in gd]
    errs = [x["error"] for x in q if "error" in x]
    if errs:
        row["qhx"] = {"error": errs[0]}
    else:
        st = [x["stats"] for x in q]
        row["qhx"] = {"prompt_tokens": sum(s["prompt_tokens"] for s in st),
                      "generated_tokens": sum(s["generated_tokens"] for s in st),
                      "load_ms": mean(s["load_ms"] for s in st), "ttft_ms": mean(s["ttft_ms"] for s in st),
                      "tok_s": mean(s["decode_tok_s"] for s in st), "ids": [x["output_ids"] for x in q]}
    g, h = row["genie"], row["qhx"]
    if "error" not in g and "error" not in h:
        row["ratio_qhx_over_genie"] = {k: ratio(h[k], g[k]) for k in ("load_ms", "ttft_ms", "tok_s")}
        row["ids_equal"] = g["ids"] == h["ids"]
    return row


def fmt(v):
    return "-" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))


def table(rows):
    hdr = ["bundle", "prompt tok", "gen tok", "load ms G", "load ms qhx", "x", "TTFT ms G", "TTFT ms qhx", "x",
           "tok/s G", "tok/s qhx", "x", "ids equal"]
    lines = [hdr]
    for r in rows:
        g, h, x = r["genie"], r["qhx"], r.get("ratio_qhx_over_genie", {})
        if "error" in g:
            lines.append([r["bundle"], f"Genie failed: {g['error']}"])
            continue
        lines.append([r["bundle"], fmt(g["prompt_tokens"]), fmt(g["generated_tokens"]), fmt(g["load_ms"]),
                      fmt(h.get("load_ms")), fmt(x.get("load_ms")), fmt(g["ttft_ms"]), fmt(h.get("ttft_ms")),
                      fmt(x.get("ttft_ms")), fmt(g["tok_s"]), fmt(h.get("tok_s")), fmt(x.get("tok_s")),
                      fmt(r.get("ids_equal"))])
        if "error" in h:
            lines.append(["", f"qhx: {h['error']}"])
    w = [max(len(ln[i]) for ln in lines if len(ln) == len(hdr)) for i in range(len(hdr))]
    out = []
    for ln in lines:
        if len(ln) == len(hdr):
            out.append("  ".join(c.ljust(w[i]) for i, c in enumerate(ln)))
        else:
            out.append("  ".join(ln))
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundles", nargs="+")
    ap.add_argument("--lib-dir", required=True)
    ap.add_argument("--qhx", required=True)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--cases", default="short,midword,question,cyrillic,code")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    cases = a.cases.split(",")
    rows = []
    for b in a.bundles:
        print(f"vs-genie: {os.path.basename(os.path.normpath(b))}", file=sys.stderr, flush=True)
        rows.append(bundle_row(b, cases, a.n, a.lib_dir, a.qhx))
    if a.json:
        print(json.dumps({"note": NOTE, "n_tokens": a.n, "cases": cases, "rows": rows}))
    else:
        print(table(rows))
        print(f"(G = libGenie.so; x = qhx/Genie; {NOTE})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
