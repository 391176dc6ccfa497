#!/usr/bin/env python3
"""Random-weight exports of the seed bundles' shapes (scripts/export-seed-shapes.sh runs this).

    seed_shapes.py OUT_DIR [--only TAG ...] [--layers N]

For each shape: writes the random checkpoint (tests/fixtures/seed_checkpoint.py, cached), runs
qhx-export in a child process (wall time and peak RSS of that process tree), then loads the
bundle with qhx_generate on the x86 HTP simulator for a prompt and 2 decode steps, and compares
the ids with the ORT reference loop over the same binaries (qhx_export.verify.loop). Prints a
markdown table (stdout) and writes OUT_DIR/summary.json. The estimates are Qualcomm's cost
model for soc 72 (v81-class), never phone measurements; the simulator's time says nothing
about a phone. Progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# tag -> (preset, qhx-export options). The seed cards: Llama-3.2-1B W8A16 v79, AR=128, C=512
# (982 / 981 MB prefill / decode, 526 MB lm-head, 525 MB embedding); DeepSeek-R1-Distill-Qwen-1.5B
# fp16 v81, C=1024.
SHAPES: dict[str, tuple[str, list[str]]] = {
    "llama-3.2-1b-w8a16": (
        "llama-3.2-1b",
        [
            "--precision",
            "w8a16",
            "--arch",
            "v79",
            "--ar",
            "128",
            "--ctx",
            "512",
            "--estimate",
            "--estimate-verify",
            "2,4,8,16",
            "--no-weight-sharing",
        ],
    ),
    "deepseek-r1-distill-qwen-1.5b-fp16": (
        "deepseek-r1-distill-qwen-1.5b",
        ["--precision", "fp16", "--arch", "v81", "--ar", "128", "--ctx", "1024", "--estimate", "--no-weight-sharing"],
    ),
    # The card's runtime shape: "decode-over-prompt seeding (no batched-prefill path at runtime)",
    # so decode + lm-head only. With the prefill context too, the simulator cannot load the second
    # 2.6 GB context (QNN_COMMON_ERROR_MEM_ALLOC), whatever the order.
    "deepseek-r1-distill-qwen-1.5b-fp16-decode": (
        "deepseek-r1-distill-qwen-1.5b",
        ["--precision", "fp16", "--arch", "v81", "--prefill", "none", "--ctx", "1024", "--no-weight-sharing"],
    ),
    "llama-3.2-1b-w4a16": (
        "llama-3.2-1b",
        ["--precision", "w4a16", "--arch", "v79", "--ar", "128", "--ctx", "512", "--estimate", "--no-weight-sharing"],
    ),
    # Weight sharing and a context ladder (issue 32): every graph in one binary, weights once.
    # The x86_64 simulator cannot load a weight-shared binary, so it is sized and estimated here,
    # not run (a phone loads it; unverified on hardware).
    "llama-3.2-1b-w4a16-ladder": (
        "llama-3.2-1b",
        [
            "--precision",
            "w4a16",
            "--arch",
            "v79",
            "--ar",
            "128",
            "--verify-rows",
            "8",
            "--ctx-ladder",
            "512,1024,2048,4096",
            "--estimate",
            "--weight-sharing",
            # sizes and estimates do not depend on how the 4-bit values are chosen; the
            # default solve takes hours at this shape on 2 cores
            "--quant-method",
            "rtn",
        ],
    ),
}
SEED_SIZES_MB = {  # the seed cards' files
    "llama-3.2-1b-w8a16": {"prefill": 982, "decode": 981, "lmhead": 526, "embed": 525},
}
PROMPT = "The capital of France is"


def log(msg: str) -> None:
    print(f"seed-shapes: {msg}", file=sys.stderr, flush=True)


def run_measured(cmd: list[str]) -> tuple[int, float, int, str]:
    """(exit status, wall seconds, peak RSS in bytes of the child, last stdout line)."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)  # reaped here, so its rusage is ours to read
    p.returncode = os.waitstatus_to_exitcode(status)
    lines = out.strip().splitlines()
    return p.returncode, time.monotonic() - t0, ru.ru_maxrss * 1024, lines[-1] if lines else ""


def check(manifest: str, n: int = 3) -> dict[str, Any]:
    """qhx_generate on the simulator vs the ORT loop over the same binaries: greedy ids."""
    from qhx_export.quant.corpus import tokenize
    from qhx_export.verify.loop import load_bundle
    from qhx_export.verify.run import find_qhx_generate, run_qhx

    root = os.path.dirname(os.path.abspath(manifest))
    with open(manifest, encoding="utf-8") as f:
        man = json.load(f)
    with open(os.path.join(root, man["artifacts"]["tokenizer"]), "rb") as f:
        tok = f.read()
    (ids,) = tokenize([PROMPT], tok, man["params"].get("bos_token_id"), 10_000)
    t0 = time.monotonic()
    got = run_qhx(find_qhx_generate(), manifest, ids, n, None)
    t_qhx = time.monotonic() - t0
    t0 = time.monotonic()
    ref = load_bundle(manifest).generate(ids, n)
    t_ort = time.monotonic() - t0
    return {
        "prompt_ids": len(ids),
        "qhx_ids": got,
        "ort_ids": ref,
        "equal": got == ref,
        "simulator_s": {"qhx_generate": round(t_qhx, 1), "ort_loop": round(t_ort, 1)},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--only", nargs="*", choices=sorted(SHAPES), help="these shapes only")
    ap.add_argument("--layers", type=int, help="fewer layers (a quick run of the same per-layer shape)")
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="check bundles already exported (keep their recorded export figures)",
    )
    a = ap.parse_args()
    cache = os.environ.get("QHX_CACHE", os.path.expanduser("~/.cache/qhx"))
    os.makedirs(a.out, exist_ok=True)
    summary_path = os.path.join(a.out, "summary.json")
    summary: dict[str, Any] = {}
    if os.path.isfile(summary_path):
        with open(summary_path, encoding="utf-8") as f:
            summary = json.load(f)
    py = sys.executable
    for tag in a.only or list(SHAPES):
        preset, opts = SHAPES[tag]
        suffix = f"-{a.layers}l" if a.layers else ""
        ck = os.path.join(cache, "seed", preset + suffix)
        cmd = [py, "-m", "fixtures.seed_checkpoint", preset, ck]
        if a.layers:
            cmd += ["--layers", str(a.layers)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        dst = os.path.join(a.out, tag + suffix)
        log(f"{tag}{suffix}: qhx-export {' '.join(opts)}")
        prev = summary.get(tag + suffix, {})
        man = os.path.join(dst, os.path.basename(ck) + ".json")  # the exporter names it after the input
        if a.reuse and os.path.isfile(man) and "export_s" in prev:
            log(f"{tag}{suffix}: reusing {dst}")
            rc, wall, rss, last = 0, prev["export_s"], prev["peak_rss_bytes"], man
            with (
                open(os.path.join(ck, "tokenizer.json"), "rb") as src,
                open(os.path.join(dst, "tokenizer.json"), "wb") as out,
            ):
                out.write(src.read())  # the checkpoint's current tokenizer
        else:
            rc, wall, rss, last = run_measured([py, "-m", "qhx_export", ck, "-o", dst, "--force", *opts])
        row: dict[str, Any] = {"options": opts, "exit": rc, "export_s": round(wall, 1), "peak_rss_bytes": rss}
        if rc == 0:
            with open(os.path.join(dst, "export-report.json"), encoding="utf-8") as f:
                rep = json.load(f)
            row["sizes"] = rep.get("sizes", {})
            mdir = os.path.dirname(last)
            for fn in os.listdir(mdir):
                if fn.endswith("_embed_f16.bin"):
                    row["sizes"][fn] = os.path.getsize(os.path.join(mdir, fn))
            row["estimate"] = rep.get("estimate")
            row["stages"] = rep.get("stages")
            log(f"{tag}{suffix}: exported in {wall:.0f}s, peak RSS {rss / 2**30:.1f} GiB; simulator check")
            try:
                row["check"] = (
                    {"equal": True, "skipped": "weight-shared: the x86_64 simulator cannot load it"}
                    if "--weight-sharing" in opts
                    else check(last)
                )
            except Exception as e:  # recorded, and the next shape still runs
                row["check"] = {"equal": False, "error": str(e)}
                log(f"{tag}{suffix}: check failed: {e}")
            if "qhx_ids" in row["check"]:
                log(f"{tag}{suffix}: qhx {row['check']['qhx_ids']} ORT {row['check']['ort_ids']}")
        summary[tag + suffix] = row
        with open(summary_path, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
    print(table(summary))
    return 0 if all(r.get("exit") == 0 and r.get("check", {}).get("equal") for r in summary.values()) else 1


def table(summary: dict[str, Any]) -> str:
    lines = [
        "| bundle | export | peak RSS | files (MB) | est. decode ms/token | ids vs ORT loop |",
        "|---|---|---|---|---|---|",
    ]
    for tag, r in summary.items():
        if r.get("exit") != 0:
            lines.append(f"| {tag} | failed (exit {r.get('exit')}) | | | | |")
            continue
        files = ", ".join(
            f"{k.split('/')[-1].rsplit('_', 2)[-2]} {v / 1e6:.0f}" for k, v in sorted(r["sizes"].items())
        )
        est = (r.get("estimate") or {}).get("decode_ms_per_token", "-")
        chk = r["check"]
        if "skipped" in chk:
            lines.append(f"| {tag} | {r['export_s'] / 60:.1f} min | {r['peak_rss_bytes'] / 2**30:.1f} GiB | {files} | {est} | not run: {chk['skipped']} |")
            continue
        if "qhx_ids" not in chk:
            lines.append(f"| {tag} | {r['export_s'] / 60:.1f} min | | | | check failed: {chk.get('error')} |")
            continue
        ok = "equal" if chk["equal"] else "DIFFER"
        lines.append(
            f"| {tag} | {r['export_s'] / 60:.1f} min | {r['peak_rss_bytes'] / 2**30:.1f} GiB | {files} "
            f"| {est} | {ok} ({len(r['check']['qhx_ids'])} tokens) |"
        )
    ver = [
        (t, r["estimate"]["verify_vs_decode"])
        for t, r in summary.items()
        if (r.get("estimate") or {}).get("verify_vs_decode")
    ]
    for tag, v in ver:
        lines += [
            "",
            f"{tag}: verify-k cost in decode steps (Hextimate, soc 72; not a phone measurement)",
            "",
            "| k | " + " | ".join(v) + " |",
            "|---|" + "---|" * len(v),
            "| cost | " + " | ".join(str(x["cost_in_decode_steps"]) for x in v.values()) + " |",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
