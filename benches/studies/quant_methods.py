#!/usr/bin/env python3
"""The 4-bit weight methods compared on the CPU before anything is compiled (issue 30): each
`--quant-method` (and `--rotate`) on the LPBQ grid, scored by the numpy reference forward with
the dequantized weights against the float one, teacher-forced on the 8 parity goldens x 32
(tests/goldens/parity/<model>_*.json, made by HF transformers): top-1 agreement with the gold
ids, mean KL divergence to the float forward, and each method's relative output error on its
calibration inputs. Activations stay float here (the bundles' are 16-bit), so this ranks weight
choices; the bundles' own figures come from scripts/export-quality.sh.

    python3 -m studies.quant_methods [--model smollm2|gemma3] [--methods rtn,seqmse,gptq]
        [--rotate none,hadamard] [--calib-seqs N] [--json]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.environ.get("QHX_CACHE", os.path.expanduser("~/.cache/qhx"))
MODELS = {
    "smollm2": ("smollm2", "assets/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3": ("gemma3", "assets/gemma3/gemma-3-270m-q4_k_m.gguf"),
}
TOKENS = 32


def log(msg: str) -> None:
    print(f"quant-methods: {msg}", file=sys.stderr, flush=True)


def cases(model: str) -> list[tuple[list[int], list[int], int]]:
    out = []
    for p in sorted(
        glob.glob(
            os.path.join(
                ROOT, "tests", "goldens", "parity", f"{MODELS[model][0]}_*.json"
            )
        )
    ):
        with open(p, encoding="utf-8") as f:
            g = json.load(f)
        gold = g["gold_ids"][:TOKENS]
        ids = g["input_ids"] + gold[:-1]
        out.append((ids, gold, len(g["input_ids"]) - 1))
    if len(out) != 8:
        raise SystemExit(f"quant-methods: expected 8 {model} goldens, found {len(out)}")
    return out


class Untied:
    """`ck` with its tied head as its own tensor (`output.weight`), nothing else changed."""

    def __init__(self, ck: Any) -> None:
        from dataclasses import replace

        self.base, self.family = ck, ck.family
        self.config = replace(ck.config, tied=False)

    def weights(self) -> Any:
        from qhx_export.quant.methods import Replaced

        w = self.base.weights()
        return Replaced(w, {"output.weight": w["token_embd.weight"]})


def with_head(ck: Any, rep: dict[str, Any], how: str) -> tuple[Any, dict[str, Any]]:
    """`ck` untied where it is tied, and `rep` with its lm-head quantized as the bundles do: int8
    per vocabulary row, or int4 LPBQ (the final norm stays apart, as in the lm-head graph)."""
    import numpy as np
    from qhx_export.quant.gptq import dequant
    from qhx_export.quant.lpbq import block_int4

    view = Untied(ck) if ck.config.tied else ck
    h = np.asarray(view.weights()["output.weight"], np.float32)  # [vocab, hidden]
    if how == "int8":
        s = np.abs(h).max(axis=1, keepdims=True) / 127
        s[s == 0] = 1
        hq = np.clip(np.round(h / s), -127, 127) * s
    else:
        hq = dequant(*block_int4(h.T)).T
    return view, {**rep, "output.weight": hq.astype(np.float32)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="quant_methods")
    ap.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    ap.add_argument("--methods", default="rtn,seqmse,gptq")
    ap.add_argument("--rotate", default="none")
    ap.add_argument(
        "--calib-seqs", type=int, default=36, help="built-in calibration sequences (36)"
    )
    ap.add_argument(
        "--calib-windows",
        type=int,
        default=0,
        help="and this many 256-token windows of the long text",
    )
    ap.add_argument(
        "--calib-len",
        type=int,
        default=256,
        help="tokens per built-in sequence at most",
    )
    ap.add_argument(
        "--group",
        type=int,
        default=1,
        help="layers per calibration forward (1: sequential)",
    )
    ap.add_argument(
        "--keep",
        default="",
        help="weight kinds left unquantized (e.g. attn_v: what keeping them costs)",
    )
    ap.add_argument(
        "--head",
        default="float",
        choices=("float", "int8", "int4"),
        help="the lm-head too (int8 per channel, int4 LPBQ)",
    )
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from qhx_export.quant import corpus
    from qhx_export.quant.methods import proxy, solve
    from qhx_export.quant.rotate import rotated
    from qhx_export.read import open_checkpoint

    base = open_checkpoint(os.path.join(CACHE, MODELS[a.model][1]))
    tj, bos = base.tokenizer_json(), base.bos_token_id()
    seqs = corpus.tokenize(corpus.builtin(base.chat_template()), tj, bos, a.calib_len)[
        : a.calib_seqs
    ]
    if a.calib_windows:
        seqs += corpus.windows(
            corpus.data_text(corpus.CALIB_LONG), tj, bos, 256, a.calib_windows
        )
    cs = cases(a.model)
    rows: list[dict[str, Any]] = []
    for rot in a.rotate.split(","):
        ck = rotated(base, rot)
        for method in a.methods.split(","):
            t0 = time.monotonic()
            sol = solve(
                ck,
                seqs,
                method,
                log=log,
                group=a.group,
                skip=[k for k in a.keep.split(",") if k],
            )
            rep = sol.dequantized()
            view = ck
            if a.head != "float":
                view, rep = with_head(ck, rep, a.head)
            res = proxy(view, cs, rep)
            row = {
                "rotate": rot,
                "group": a.group,
                "kept_float": a.keep,
                "head": a.head,
                **sol.summary(),
                "agreement": round(res.agreement, 4),
                "lowest_prompt": round(min(res.per_seq), 4),
                "kld": round(res.kld, 5),
                "positions": res.positions,
                "wall_s": round(time.monotonic() - t0, 1),
            }
            rows.append(row)
            log(json.dumps(row))
    doc = {
        "model": a.model,
        "what": "numpy forward, LPBQ-32 weights, float activations",
        "rows": rows,
    }
    if a.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(
        "| rotate | method | TF top-1 vs HF | lowest prompt | mean KLD | output error | s |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        err = r["mean_relative_output_error"]
        print(
            f"| {r['rotate']} | {r['method']} | {100 * r['agreement']:.1f} % | {100 * r['lowest_prompt']:.1f} % "
            f"| {r['kld']:.4f} | {err if err is not None else '—'} | {r['wall_s']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
