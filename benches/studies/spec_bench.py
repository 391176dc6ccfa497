#!/usr/bin/env python3
"""Speculative decoding on the task set (benches/studies/spec-tasks.json), SmolLM2 real weights on the
emulator, in every mode (lookup, lookahead, and a draft model when one is given): per task, tokens per verify, decode executes per token, and the decode speedup
estimated from Qualcomm's cost model (the exporter's --estimate of the verify-size graph and of
decode + lm-head, soc_model 72), never from emulator time. Also checks that every task's greedy
ids equal the plain run's. Run by scripts/spec-bench.sh, which supplies the paths.

Estimated cost of a run's decode phase (tokens after the first), with c = decode + lm-head:
  plain:       T * c
  speculative: plain_steps * c + verifies * V + verify_tokens * lm-head (+ draft executes * d)
where V = max(verify graph, decode graph): a verify is never counted cheaper than a decode step
(the cost model rates the 8-row graph below the 1-row one; the raw ratio is printed too), and
every token a verify yields reads one lm-head row (the runtime runs the 1-row head per row), and
d is the draft model's decode + lm-head (--draft-estimate: SmolLM2 W4A16's, the natural draft).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def log(msg: str) -> None:
    print(f"spec-bench: {msg}", file=sys.stderr, flush=True)


def run(gen: Path, lib: Path, man: Path, task: dict, extra: list[str]) -> dict:
    cmd = [
        str(gen),
        str(man),
        str(lib),
        str(lib),
        str(man.parent),
        str(task["n"]),
        task["prompt"],
    ]
    cmd += ["--chat", "--json", "--ignore-eos", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise SystemExit(
            f"spec-bench: {task['id']}: qhx_generate exited {p.returncode}: {p.stderr.strip()[-400:]}"
        )
    return json.loads(p.stdout)


def estimates(report: Path) -> dict[str, float]:
    est = json.loads(report.read_text()).get("estimate") or {}
    g = est.get("graphs", {})
    try:
        return {r: float(g[r]["us"]) for r in ("prefill", "decode", "lmhead")}
    except (KeyError, TypeError) as e:
        raise SystemExit(
            f"spec-bench: {report}: no Hextimate figure for {e} (export with --estimate)"
        ) from e


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--generate", type=Path, required=True)
    ap.add_argument("--lib", type=Path, required=True, help="libqnn_emu.so")
    ap.add_argument(
        "--manifest", type=Path, required=True, help="a bundle with a verify graph"
    )
    ap.add_argument("--tasks", type=Path, required=True)
    ap.add_argument(
        "--estimate",
        type=Path,
        required=True,
        help="export-report.json with the verify-size graph",
    )
    ap.add_argument(
        "--json",
        action="store_true",
        help="one JSON document on stdout instead of the table",
    )
    ap.add_argument(
        "--draft",
        type=Path,
        help="a draft bundle's manifest for --spec draft (same tokenizer)",
    )
    ap.add_argument(
        "--draft-estimate",
        type=Path,
        help="export-report.json with the draft model's decode and lm-head estimate",
    )
    ap.add_argument(
        "--spec-args",
        default="",
        help="more qhx_generate flags for the speculative runs",
    )
    a = ap.parse_args()
    us = estimates(a.estimate)
    c = us["decode"] + us["lmhead"]
    v = max(us["prefill"], us["decode"])
    raw = (us["prefill"] + us["lmhead"]) / c
    cost = (
        v + us["lmhead"]
    ) / c  # one head row: the verify cost the adaptive switch weighs
    log(
        f"Hextimate (soc 72, not a phone measurement): verify graph {us['prefill'] / 1000:.1f} ms, "
        f"decode {us['decode'] / 1000:.1f} ms, lm-head {us['lmhead'] / 1000:.2f} ms; "
        f"verify/decode {raw:.2f} raw, {cost:.2f} counted"
    )
    tasks = json.loads(a.tasks.read_text())["tasks"]
    d_us = None
    if a.draft_estimate is not None:
        du = estimates(a.draft_estimate)
        d_us = du["decode"] + du["lmhead"]
        log(
            f"Hextimate of the draft model (decode + lm-head): {d_us / 1000:.2f} ms per draft token"
        )
    modes: list[tuple[str, list[str]]] = [
        ("lookup", ["--spec", "lookup"]),
        ("lookahead", ["--spec", "lookahead"]),
    ]
    if a.draft is not None:
        modes.append(("draft", ["--spec", "draft", str(a.draft)]))
    rows, ok = [], True
    for t in tasks:
        log(f"{t['id']}: plain")
        plain = run(a.generate, a.lib, a.manifest, t, [])
        for mode, flags in modes:
            log(f"{t['id']}: {' '.join(flags[:2])} --spec-adaptive {cost:.2f}")
            spec = run(
                a.generate,
                a.lib,
                a.manifest,
                t,
                [*flags, "--spec-adaptive", f"{cost:.4f}", *a.spec_args.split()],
            )
            same = plain["output_ids"] == spec["output_ids"]
            ok &= same
            s = spec["spec"]
            n_plain, verifies = s["plain"], s["verifies"]
            vt = round(s["tokens_per_verify"] * verifies)
            tokens = n_plain + vt
            est_plain = tokens * c
            est_spec = n_plain * c + verifies * v + vt * us["lmhead"]
            draft_execs = s.get("draft_executes") or 0
            if mode == "draft":
                # Each draft execute is one draft-model decode + lm-head (its prompt chunks
                # counted the same: an overestimate that favours plain decoding).
                est_spec += draft_execs * (d_us if d_us is not None else c)
            rows.append(
                {
                    "task": t["id"],
                    "kind": t["kind"],
                    "mode": mode,
                    "tokens": len(spec["output_ids"]),
                    "ids_equal_plain": same,
                    "tokens_per_verify": round(s["tokens_per_verify"], 2),
                    "decode_executes_per_token": round(
                        s["decode_executes_per_token"], 3
                    ),
                    "verifies": verifies,
                    "plain_steps": n_plain,
                    "skipped": s["skipped"],
                    "switched_off": s["switched_off"],
                    "draft_executes": draft_execs,
                    "est_speedup": round(est_plain / est_spec, 3) if est_spec else None,
                }
            )
    doc = {
        "model": str(a.manifest),
        "estimate": {
            "source": str(a.estimate),
            "us": us,
            "verify_over_decode_raw": round(raw, 3),
            "verify_cost_counted": round(cost, 3),
            "note": "Hextimate cost model (soc 72, v81-class); not a phone measurement",
        },
        "tasks": rows,
    }
    if a.json:
        print(json.dumps(doc, indent=1))
    else:
        hdr = (
            f"{'task':<12} {'mode':<10} {'tokens/verify':>13} {'executes/token':>14} {'verifies':>8} "
            f"{'skipped':>7} {'est. speedup':>12}  ids"
        )
        print(hdr)
        for r in rows:
            print(
                f"{r['task']:<12} {r['mode']:<10} {r['tokens_per_verify']:>13.2f} "
                f"{r['decode_executes_per_token']:>14.3f} "
                f"{r['verifies']:>8} {r['skipped']:>7} {r['est_speedup']:>11.3f}x  "
                f"{'equal' if r['ids_equal_plain'] else 'DIFFER'}"
            )
    if not ok:
        log("greedy ids differ from the plain run on a task")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
